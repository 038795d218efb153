"""Leave free space in each page of the archive table so a poll's chunk rewrite is a HOT update (#14).

Every one-minute poll rewrites the open chunks of each running job (`archive.upsert`: INSERT ... ON CONFLICT
DO UPDATE of "end" and "values", neither indexed). With the default fillfactor (100) the pages are full, so
the new row version goes to another page and all three indexes get a new entry: measured on
benchmarks/poll_cycle.py --gpus 1000 (steady cycle 3, 24,391 rows written), 498 of 32,506 updates were HOT
and the INSERT took 1.81 s; with fillfactor 70, 96 % of that cycle's updates were HOT and the INSERT took
0.38 s (Postgres CPU of the cycle 2.4 s -> 1.7 s). Cost: pages written from now on are filled to 70 %
(closed chunks keep that slack; dead versions are pruned within the page instead of by VACUUM).
Existing pages keep their fill until rewritten (VACUUM FULL / pg_repack)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("jobs", "0010_compact_archive")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE jobs_jobseries SET (fillfactor = 70)",
            reverse_sql="ALTER TABLE jobs_jobseries RESET (fillfactor)",
        )
    ]
