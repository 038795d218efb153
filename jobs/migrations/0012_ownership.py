"""Verified ownership (issue 23 items 1-2): typed API tokens (user | scheduler, with the scheduler's
cluster) and each job's provenance (who registered it, from which cluster, with which credential).

Existing jobs: a job discovery created (`discovered_by` set, jobs.metrics.discovery) is `discovery`;
every other existing job is `member`: before this migration nothing told a scheduler's registration from
a member's, so none is trusted with the idle policy's cancel until its scheduler registers it again
(which takes it over, jobs.ownership)."""

from typing import Any

from django.db import migrations, models


def provenance_of_existing_jobs(apps: Any, schema_editor: Any) -> None:
    Job = apps.get_model("jobs", "Job")
    Job.objects.exclude(discovered_by="").update(registered_by="discovery")
    Job.objects.filter(discovered_by="").update(registered_by="member")


class Migration(migrations.Migration):
    dependencies = [("jobs", "0011_jobseries_fillfactor")]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="cluster",
            field=models.CharField(
                blank=True,
                help_text="The scheduler cluster a scheduler token speaks for (required for kind=scheduler).",
                max_length=100,
            ),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="kind",
            field=models.CharField(
                choices=[
                    ("user", "User (acts as its user)"),
                    ("scheduler", "Scheduler integration (cluster-scoped service credential)"),
                ],
                default="user",
                max_length=16,
            ),
        ),
        migrations.AddConstraint(
            model_name="apitoken",
            constraint=models.CheckConstraint(
                condition=~models.Q(kind="scheduler") | ~models.Q(cluster=""),
                name="apitoken_scheduler_has_cluster",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="cluster",
            field=models.CharField(
                blank=True,
                help_text="The scheduler cluster whose credential registered the job.",
                max_length=100,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="registered_by",
            field=models.CharField(
                choices=[
                    ("member", "Team member (by hand)"),
                    ("scheduler", "Scheduler integration (service credential)"),
                    ("discovery", "Discovery (exporter label)"),
                    ("staff", "Staff"),
                    ("import", "Import (management command)"),
                    ("demo", "Demo data"),
                ],
                default="member",
                help_text=(
                    "Who registered the job: a team member by hand, a scheduler credential, discovery, staff."
                ),
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="registered_via",
            field=models.CharField(
                blank=True,
                help_text="The credential (token name and prefix) or user that registered it.",
                max_length=200,
            ),
        ),
        migrations.AlterField(
            model_name="idlepolicy",
            name="action",
            field=models.CharField(
                choices=[
                    ("command", "Command hook (e.g. scancel)"),
                    ("kubernetes", "Kubernetes: suspend the owning Job/JobSet"),
                ],
                default="command",
                max_length=16,
            ),
        ),
        migrations.RunPython(provenance_of_existing_jobs, migrations.RunPython.noop),
    ]
