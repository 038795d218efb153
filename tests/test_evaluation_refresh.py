"""Re-evaluation when an input other than the signals changes: a baseline promoted (the reference MFU),
a price book entry (cost and waste), with the stored evaluation and the columns written together."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.evaluation.baselines import SYSTEM, promote
from jobs.intake.registry import register_job
from jobs.models import Artifact, Finding, PriceEntry, ProgressSample
from jobs.pipeline.refresh import reevaluate
from tests.conftest import job_body

H100_BF16_PEAK = 989.5e12
# job_body's model: N = 6.7e9, L = 32, H = 32, Q = 128, T = 4096 (PaLM convention, no fallback):
# FLOPs/token = 6 × 6.7e9 + 12 × 32 × 32 × 128 × 4096 = 4.02e10 + 6,442,450,944 = 46,642,450,944.
FLOPS_PER_TOKEN = 6 * 6.7e9 + 12 * 32 * 32 * 128 * 4096


@pytest.fixture
def job(db, make_team, catalog, settings):
    from jobs.api.serializers import JobRegisterSerializer

    settings.DEFAULT_PRICE_TIER = "spot"
    make_team("llm")
    start = timezone.now() - timedelta(hours=3)
    end = start + timedelta(hours=2)

    def make(external_id: str, mfu: float):
        body = JobRegisterSerializer(
            data=job_body(external_id, started_at=start.isoformat(), ended_at=end.isoformat(), price_tier="")
        )
        body.is_valid(raise_exception=True)
        created = register_job(body.validated_data).job
        # Tokens for the given MFU over the 2 h: tps = MFU × 8 × peak / FLOPs per token.
        tps = mfu * 8 * H100_BF16_PEAK / FLOPS_PER_TOKEN
        ProgressSample.objects.create(job=created, timestamp=start, tokens=0)
        ProgressSample.objects.create(job=created, timestamp=end, tokens=round(tps * 7200))
        created.status = created.Status.FINALIZED
        created.save()
        return reevaluate(created.pk)

    PriceEntry.objects.filter(tier="spot").delete()
    return make


def _gpu(job):  # type: ignore[no-untyped-def]
    return job.gpu_model


@pytest.mark.django_db
def test_reevaluate_stores_columns_and_the_typed_evaluation_together(job):
    j = job("a", 0.30)
    # No spot price in the book: cost and waste are unknown, with the reason; MFU is known.
    assert j.mfu == pytest.approx(0.30, rel=1e-4)
    assert not j.mfu_fallback
    assert j.cost_per_day_usd is None and j.waste_per_day_usd is None
    assert "price" in j.waste_unknown_reason
    assert j.evaluated is not None and j.evaluated.mfu == j.mfu


@pytest.mark.django_db
def test_a_price_book_entry_reevaluates_that_gpu_models_jobs(
    job, celery_eager, django_capture_on_commit_callbacks
):
    j = job("a", 0.30)
    with django_capture_on_commit_callbacks(execute=True):
        PriceEntry.objects.create(
            gpu_model=_gpu(j),
            tier="spot",
            usd_per_gpu_hour=2,
            effective_from=j.started_at - timedelta(days=1),
        )
    j.refresh_from_db()
    # cost/day = 8 × $2 × 24 = $384; waste = 384 × (1 − 0.30 / 0.45) = $128 (BF16 organisation target).
    assert j.cost_per_day_usd == pytest.approx(384.0)
    assert j.waste_per_day_usd == pytest.approx(128.0, rel=1e-3)


@pytest.mark.django_db
def test_a_price_change_moves_the_findings_dollars_with_the_jobs_waste(
    job, celery_eager, django_capture_on_commit_callbacks
):
    j = job("a", 0.30)
    # A parsed trace whose host blocks 400 of 1,000 ms: host_sync fires from the trace alone.
    Artifact.objects.create(
        job=j, kind="kineto", original_name="t.json", sha256="b" * 64, size_bytes=1,
        status=Artifact.Status.DONE,
        analysis={"ranks": [{"rank": 0, "temporal_breakdown": {"idle_pct": 30.0, "span_ms": 1000.0},
                             "sync": {"cpu_sync_calls": 60, "cpu_sync_ms": 400.0},
                             "step_times": {"count": 5}}]},
    )  # fmt: skip
    reevaluate(j.pk)
    # No spot price yet: the job's waste is unknown, so the finding's impact is unknown (None), not $0.
    assert Finding.objects.get(job=j, code="host_sync").waste_per_day_usd is None
    with django_capture_on_commit_callbacks(execute=True):
        since = j.started_at - timedelta(days=3)
        PriceEntry.objects.create(gpu_model=_gpu(j), tier="spot", usd_per_gpu_hour=2, effective_from=since)
    # The re-evaluation re-ran the diagnosis: the finding now has dollars, within the job's $128/day.
    usd = Finding.objects.get(job=j, code="host_sync").waste_per_day_usd
    assert usd is not None and 0 < usd <= 128.0


@pytest.mark.django_db
def test_promoting_a_baseline_moves_the_reference_of_its_jobs(
    job, celery_eager, django_capture_on_commit_callbacks
):
    PriceEntry.objects.create(
        gpu_model=job("seed", 0.1).gpu_model, tier="spot", usd_per_gpu_hour=2,
        effective_from=timezone.now() - timedelta(days=30),
    )  # fmt: skip
    slow = reevaluate(job("slow", 0.30).pk)
    assert slow.waste_per_day_usd == pytest.approx(128.0, rel=1e-3)
    fast = job("fast", 0.60)
    with django_capture_on_commit_callbacks(execute=True):
        promote(fast, SYSTEM)
    slow.refresh_from_db()
    # Reference = the baseline's MFU median 0.60: waste = 384 × (1 − 0.30 / 0.60) = $192.
    assert slow.evaluated is not None and slow.evaluated.reference_mfu == pytest.approx(0.60, rel=1e-4)
    assert slow.waste_per_day_usd == pytest.approx(192.0, rel=1e-3)


@pytest.mark.django_db
def test_reevaluate_command_brings_stored_jobs_to_the_current_definitions(job):
    from io import StringIO

    from django.core.management import CommandError, call_command

    from jobs.models import Job

    j = job("a", 0.30)
    Job.objects.filter(pk=j.pk).update(evaluation={}, mfu=None)  # as after an upgrade
    out = StringIO()
    call_command("reevaluate", "a", stdout=out)
    assert "re-evaluated 1 of 1 jobs" in out.getvalue()
    j.refresh_from_db()
    assert j.mfu == pytest.approx(0.30, rel=1e-4) and j.evaluated is not None
    with pytest.raises(CommandError, match="no such job: nope"):
        call_command("reevaluate", "nope")
    with pytest.raises(CommandError, match="--all"):
        call_command("reevaluate")


@pytest.mark.django_db
def test_a_batch_of_price_entries_queues_one_reevaluation_per_gpu_model(
    job, django_capture_on_commit_callbacks, monkeypatch
):
    from jobs.pipeline import refresh

    j = job("a", 0.30)
    queued: list[list[int]] = []
    monkeypatch.setattr(refresh, "_enqueue", queued.append)
    with django_capture_on_commit_callbacks(execute=True):
        for usd in (1, 2, 3):
            PriceEntry.objects.create(
                gpu_model=j.gpu_model, tier="spot", usd_per_gpu_hour=usd,
                effective_from=j.started_at - timedelta(days=usd),
            )  # fmt: skip
    assert queued == [[j.pk]]
