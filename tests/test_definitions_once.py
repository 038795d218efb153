"""Issue 27 item 3: the leaderboard's SQL (jobs/outputs/leaderboard.py: period_rows, worst_jobs) computes
GPU-hours, cost, waste and team MFU inside a period exactly as jobs/evaluation/totals.py defines them.

The leaderboard keeps its SQL for speed (one pass for all periods); these tests make it a copy of the one
definition rather than a second one. The sample jobs cover what the definitions distinguish: shared GPUs
(GPU-equivalents below the GPU count), a MIG slice (peak-equivalents differ from GPU-equivalents), a job
still running (its window ends at now), a job spanning two weeks, no price, waste unknown with an idle
lower bound, waste unknown without one, and no MFU.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from jobs.evaluation.costs import total_waste
from jobs.evaluation.schema import Evaluation, GpuSharing, encode
from jobs.evaluation.totals import (
    JobRates,
    cost_inside,
    gpu_hours_inside,
    hours_inside,
    waste_inside,
    weighted_mfu,
)
from jobs.models import Job, Team
from jobs.outputs.leaderboard import Period, iso_week, period_rows, worst_jobs
from jobs.templatetags.units import job_waste_total

SHARED = GpuSharing(share=0.5, gpu_equivalents=4.0, peak_equivalents=4.0, label="time-sliced")
# A 3g.40gb MIG slice on each of 2 H100s: 3/7 of each GPU's cost, 3 x 16 of 132 SMs of its peak.
MIG = GpuSharing(share=3 / 7, gpu_equivalents=6 / 7, peak_equivalents=2 * 48 / 132, label="MIG 3g.40gb")


def _rates(job: Job, now: datetime) -> JobRates:
    evaluated = job.evaluated
    sharing = evaluated.sharing if evaluated is not None else None
    return JobRates(
        started=job.started_at,
        stopped=job.ended_at or now,
        gpu_equivalents=sharing.gpu_equivalents if sharing else float(job.gpu_count),
        peak_equivalents=sharing.peak_equivalents if sharing else float(job.gpu_count),
        cost_per_day_usd=job.cost_per_day_usd,
        waste_per_day_usd=job.waste_per_day_usd,
        waste_lower_bound_per_day_usd=job.waste_lower_bound_per_day_usd,
        mfu=job.mfu,
    )


@pytest.fixture
def sample(db: None, make_team: Callable[..., Team]) -> tuple[list[Period], datetime, list[Job]]:
    week = iso_week(timezone.now().date() - timedelta(days=21))
    before = week.previous()
    now = week.start + timedelta(days=4, hours=7, minutes=13)  # "now" inside the week: J-run is cut there
    llm, serve = make_team("llm", "LLM"), make_team("serve", "Serving")

    def job(team: Team, ext: str, start: datetime, end: datetime | None, gpus: int, **kw: object) -> Job:
        sharing = kw.pop("sharing", None)
        duration = ((end or now) - start).total_seconds()
        evaluation = Evaluation(duration_s=duration, gpu_hours=gpus * duration / 3600, sharing=sharing)  # type: ignore[arg-type]
        return Job.objects.create(
            team=team, external_id=ext, started_at=start, ended_at=end, gpu_count=gpus,
            status=Job.Status.FINALIZED if end else Job.Status.RUNNING, evaluation=encode(evaluation), **kw,
        )  # fmt: skip

    w = week.start
    jobs = [
        # Spans the two weeks, on time-sliced GPUs: 4 GPU-equivalents of 8.
        job(llm, "J-span", w - timedelta(days=2, hours=5), w + timedelta(days=1, hours=3), 8, sharing=SHARED,
            cost_per_day_usd=660.48, waste_per_day_usd=182.94, waste_lower_bound_per_day_usd=182.94, mfu=0.2),
        # Still running at `now`; MFU unknown, waste "at least" its idle part.
        job(llm, "J-run", w + timedelta(days=2), None, 2, cost_per_day_usd=330.24,
            waste_lower_bound_per_day_usd=41.5, mfu=None),
        # A MIG slice, no price: cost and waste unknown, MFU known against its peak-equivalents.
        job(llm, "J-mig", w + timedelta(hours=1), w + timedelta(days=3, hours=2, minutes=30), 2, sharing=MIG,
            mfu=0.41),
        # Whole GPUs, all known.
        job(llm, "J-a100", w + timedelta(days=1), w + timedelta(days=1, hours=9), 4, cost_per_day_usd=329.28,
            waste_per_day_usd=20.0, waste_lower_bound_per_day_usd=12.0, mfu=0.5),
        # Waste unknown without even an idle lower bound.
        job(serve, "S-1", w - timedelta(days=1), w + timedelta(hours=20), 1, cost_per_day_usd=165.12,
            mfu=None),
        job(serve, "S-2", w + timedelta(days=3), w + timedelta(days=3, hours=1), 16, cost_per_day_usd=2641.92,
            waste_per_day_usd=900.0, waste_lower_bound_per_day_usd=100.0, mfu=0.31),
    ]  # fmt: skip
    return [before, week], now, jobs


def _expected(jobs: list[Job], period: Period, now: datetime) -> dict[int, dict[str, object]]:
    out: dict[int, dict[str, object]] = defaultdict(
        lambda: {"gpu_hours": 0.0, "cost": 0.0, "waste": 0.0, "mfu_items": [], "jobs": 0}
    )
    for job in jobs:
        rates = _rates(job, now)
        if hours_inside(rates.started, rates.stopped, period.start, period.end) <= 0:
            continue
        row = out[job.team_id]
        row["jobs"] += 1  # type: ignore[operator]
        row["gpu_hours"] += gpu_hours_inside(rates, period.start, period.end)  # type: ignore[operator]
        cost = cost_inside(rates, period.start, period.end)
        row["cost"] += cost or 0.0  # type: ignore[operator]
        waste = waste_inside(rates, period.start, period.end)
        row["waste"] += waste.usd or 0.0  # type: ignore[operator]
        hours = hours_inside(rates.started, rates.stopped, period.start, period.end)
        row["mfu_items"].append((rates.mfu, hours * rates.peak_equivalents))  # type: ignore[attr-defined]
    return out


def test_the_leaderboards_sql_equals_the_definitions_for_every_team_and_period(
    sample: tuple[list[Period], datetime, list[Job]],
) -> None:
    periods, now, jobs = sample
    rows = period_rows(periods, now)
    checked = 0
    for period, by_team in zip(periods, rows, strict=True):
        expected = _expected(jobs, period, now)
        assert set(by_team) == set(expected), period.label
        for team_id, want in expected.items():
            got = by_team[team_id]
            assert got.jobs == want["jobs"]
            assert got.gpu_hours == pytest.approx(want["gpu_hours"], rel=1e-9)
            assert got.cost_usd == pytest.approx(want["cost"], rel=1e-9)
            assert got.waste_lower_bound_usd == pytest.approx(want["waste"], rel=1e-9)
            mfu = weighted_mfu(want["mfu_items"])  # type: ignore[arg-type]
            assert got.weighted_mfu == (pytest.approx(mfu, rel=1e-9) if mfu is not None else None)
            checked += 1
    assert checked == 4  # both teams in both weeks: none of the comparisons was skipped


def test_the_weighting_is_gpu_hours_not_peak_capacity(
    sample: tuple[list[Period], datetime, list[Job]],
) -> None:
    # J-mig (MFU 0.41, 0.727 peak-equivalents) and J-a100 (0.5, 4 GPUs) both in the week: GPU-hour weights,
    # so the result is independent of which GPU model's peak is larger.
    periods, now, _ = sample
    week = periods[1]
    llm = Team.objects.get(slug="llm")
    row = period_rows([week], now)[0][llm.pk]
    span_h, mig_h, a100_h = 27.0, 73.5, 9.0  # hours inside the week, from the fixture's times
    by_hand = (0.2 * 4 * span_h + 0.41 * (96 / 132) * mig_h + 0.5 * 4 * a100_h) / (
        4 * span_h + (96 / 132) * mig_h + 4 * a100_h
    )
    assert row.weighted_mfu == pytest.approx(by_hand, rel=1e-9)


def test_worst_jobs_ranks_by_the_defined_waste_inside_the_period(
    sample: tuple[list[Period], datetime, list[Job]],
) -> None:
    periods, now, jobs = sample
    by_ext = {job.external_id: job for job in jobs}
    for period in periods:
        listed = worst_jobs(period, limit=20, now=now)
        assert listed, period.label
        for got in listed:
            rates = _rates(by_ext[got.external_id], now)
            want = waste_inside(rates, period.start, period.end)
            assert got.waste_in_period == pytest.approx(want.usd, rel=1e-9)  # type: ignore[attr-defined]
            assert got.waste_in_period_is_lower_bound == want.lower_bound  # type: ignore[attr-defined]
            assert got.gpu_h == pytest.approx(gpu_hours_inside(rates, period.start, period.end))  # type: ignore[attr-defined]
        # Jobs with a known or bounded waste inside the period are all listed; S-1 (no bound) never is.
        shown = {j.external_id for j in listed}
        assert "S-1" not in shown
        for job in jobs:
            rates = _rates(job, now)
            amount = waste_inside(rates, period.start, period.end)
            if amount.usd:
                assert job.external_id in shown, (period.label, job.external_id)


def test_the_job_pages_total_waste_is_the_rate_over_the_whole_run(
    sample: tuple[list[Period], datetime, list[Job]],
) -> None:
    _, now, jobs = sample
    for job in jobs:
        job = Job.objects.get(pk=job.pk)
        evaluated = job.evaluated
        assert evaluated is not None
        rates = _rates(job, now)
        whole = waste_inside(rates, rates.started, rates.stopped)
        shown = job_waste_total(job)
        assert shown == total_waste(job.waste_amount, evaluated.duration_s)
        if whole.usd is None:
            assert shown.usd is None
        else:
            assert shown.usd == pytest.approx(whole.usd, rel=1e-9) and shown.lower_bound == whole.lower_bound
