"""The evaluation spine: waste split by what each part needs (idle vs efficiency), unknown instead of zero,
the FLOPs variant per job, and the free-form `Job.summary` replaced by typed fields.

- Existing findings keep their dollars; a finding stored as $0 on a job whose waste was unknown becomes
  "impact unknown" (null), since that $0 was never computed.
- Ingestion facts move from `summary` to typed columns (energy_j, missing_reasons, diagnosed_at,
  profiler_step_time_ms, profiler_comm_share_pct, finalize_note). Computed numbers are not copied: they
  are recomputed into `evaluation` by the next poll/finalize (`manage.py ingest --once`), and until then
  a job reads as not evaluated rather than showing numbers of an older definition.
"""

import django.core.validators
from django.db import migrations, models


def zero_to_unknown(apps, schema_editor):
    Finding = apps.get_model("jobs", "Finding")
    Finding.objects.filter(job__waste_per_day_usd__isnull=True, waste_per_day_usd=0).update(waste_per_day_usd=None)


def _number(value):
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def summary_to_fields(apps, schema_editor):
    from datetime import UTC, datetime

    Job = apps.get_model("jobs", "Job")
    for job in Job.objects.exclude(summary={}).iterator():
        s = job.summary or {}
        job.energy_j = _number(s.get("energy_j"))
        reasons = s.get("missing_reasons")
        job.missing_reasons = {str(k): str(v) for k, v in reasons.items()} if isinstance(reasons, dict) else {}
        at = _number(s.get("diagnosed_at"))
        job.diagnosed_at = datetime.fromtimestamp(at, tz=UTC) if at is not None else None
        job.profiler_step_time_ms = _number(s.get("profiler_step_time_ms"))
        job.profiler_comm_share_pct = _number(s.get("profiler_comm_share_pct"))
        job.finalize_note = str(s.get("finalize_note") or "")[:300]
        job.discovered_by = str(s.get("discovered_by") or "")[:300] if s.get("discovered") else ""
        job.save(
            update_fields=[
                "energy_j", "missing_reasons", "diagnosed_at", "profiler_step_time_ms",
                "profiler_comm_share_pct", "finalize_note", "discovered_by",
            ]
        )


def fields_to_summary(apps, schema_editor):
    Job = apps.get_model("jobs", "Job")
    for job in Job.objects.iterator():
        job.summary = {
            k: v
            for k, v in {
                "energy_j": job.energy_j,
                "missing_reasons": job.missing_reasons or None,
                "diagnosed_at": job.diagnosed_at.timestamp() if job.diagnosed_at else None,
                "profiler_step_time_ms": job.profiler_step_time_ms,
                "profiler_comm_share_pct": job.profiler_comm_share_pct,
                "finalize_note": job.finalize_note or None,
                "discovered": True if job.discovered_by else None,
                "discovered_by": job.discovered_by or None,
            }.items()
            if v is not None
        }
        job.save(update_fields=["summary"])


class Migration(migrations.Migration):
    dependencies = [("jobs", "0004_gpu_clocks")]

    operations = [
        migrations.AlterField(
            model_name="finding",
            name="waste_per_day_usd",
            field=models.FloatField(
                blank=True,
                null=True,
                validators=[django.core.validators.MinValueValidator(0)],
                help_text="$/day this cause explains; null = impact unknown (the job's waste is unknown), never 0.",
            ),
        ),
        migrations.AlterModelOptions(
            name="finding",
            options={"ordering": [models.F("waste_per_day_usd").desc(nulls_last=True), "code"]},
        ),
        migrations.AddField(
            model_name="job",
            name="waste_lower_bound_per_day_usd",
            field=models.FloatField(
                blank=True,
                null=True,
                help_text="What is certainly wasted, $/day: the total when known, else the idle part (see reason).",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="idle_waste_per_day_usd",
            field=models.FloatField(
                blank=True, null=True, help_text="cost/day × share of observed GPU-time at ~0 % GPU_UTIL."
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="efficiency_waste_per_day_usd",
            field=models.FloatField(
                blank=True, null=True, help_text="cost/day × max(0, 1 − MFU ÷ reference MFU); null without MFU."
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="waste_unknown_reason",
            field=models.CharField(
                blank=True, max_length=300, help_text="Why the total waste is unknown; empty when it is known."
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="flops_variant",
            field=models.CharField(
                blank=True, max_length=200, help_text="FLOPs-per-token formula behind the MFU (e.g. 6N+12LHQT)."
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="mfu_fallback",
            field=models.BooleanField(
                default=False,
                help_text="MFU computed with a simpler formula than the organisation's convention (shape missing).",
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="waste_per_day_usd",
            field=models.FloatField(
                blank=True, null=True, help_text="Total waste $/day = max(idle, efficiency); null when MFU unknown."
            ),
        ),
        migrations.RunPython(zero_to_unknown, migrations.RunPython.noop),
        migrations.AddField(
            model_name="job",
            name="evaluation",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text="Typed evaluation (jobs.evaluation.schema.Evaluation), written by evaluation.store only.",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="energy_j",
            field=models.FloatField(
                blank=True, null=True, help_text="Increase of DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION over the job, J."
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="missing_reasons",
            field=models.JSONField(
                blank=True, default=dict, help_text="{signal key: why it is missing} from the last ingestion."
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="diagnosed_at",
            field=models.DateTimeField(blank=True, null=True, help_text="When the diagnosis last ran."),
        ),
        migrations.AddField(
            model_name="job",
            name="profiler_step_time_ms",
            field=models.FloatField(
                blank=True, null=True, help_text="Median step time of the latest parsed profiler trace, ms."
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="profiler_comm_share_pct",
            field=models.FloatField(
                blank=True, null=True, help_text="Share of the step in communication kernels, latest trace, %."
            ),
        ),
        migrations.AddField(
            model_name="job", name="finalize_note", field=models.CharField(blank=True, max_length=300)
        ),
        migrations.AddField(
            model_name="job",
            name="discovered_by",
            field=models.CharField(
                blank=True, max_length=300, help_text="The label matcher a discovered job was registered from."
            ),
        ),
        migrations.RunPython(summary_to_fields, fields_to_summary),
        migrations.RemoveField(model_name="job", name="summary"),
    ]
