"""Job.util_coverage: the GPU_UTIL coverage of the stored evaluation as a column the leaderboard counts on;
copied from each job's evaluation JSON (the next evaluation writes it anyway)."""

import math

from django.db import migrations, models


def copy_coverage(apps, schema_editor):  # type: ignore[no-untyped-def]
    Job = apps.get_model("jobs", "Job")
    batch = []
    for job in Job.objects.exclude(evaluation=None).only("pk", "evaluation").iterator(chunk_size=500):
        coverage = (job.evaluation or {}).get("coverage") if isinstance(job.evaluation, dict) else None
        value = coverage.get("gpu_util") if isinstance(coverage, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            job.util_coverage = float(value)
            batch.append(job)
    Job.objects.bulk_update(batch, ["util_coverage"], batch_size=500)


class Migration(migrations.Migration):
    dependencies = [("jobs", "0006_artifact_run_check_job_kind")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="util_coverage",
            field=models.FloatField(
                blank=True,
                help_text="Share of the GPU-time with GPU_UTIL samples (0-1); null = unknown. Shown when < 0.9.",
                null=True,
            ),
        ),
        migrations.RunPython(copy_coverage, migrations.RunPython.noop),
    ]
