"""Issue 25 item 4: totals of a job on shared GPUs come from its stored evaluation (duration and
GPU-equivalents), on the leaderboard as on the job list. Expected values derived by hand below."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.evaluation.schema import Evaluation, GpuSharing, encode
from jobs.models import GpuModel, Job, Team
from jobs.outputs.leaderboard import Period, iso_week, team_rows, worst_jobs
from jobs.templatetags.units import job_waste_total

# One day on 8 time-sliced H100s at a 0.5 share: 4 GPU-equivalents. Cost $6.88/GPU-h (the seeded H100
# on-demand book, which the leaderboard prices the day from) x 4 x 24 h = $660.48/day,
# GPU-hours 4 x 24 = 96 (not 8 x 24 = 192); waste $182.94/day (per share). MFU 0.2 against 4 GPU peaks.
SHARING = GpuSharing(share=0.5, gpu_equivalents=4.0, peak_equivalents=4.0, label="4 GPU-equivalents")


@pytest.fixture
def week() -> Period:
    return iso_week(timezone.now().date() - timedelta(days=14))


@pytest.fixture
def shared_job(db: None, make_team: Callable[..., Team], week: Period) -> tuple[Team, Job]:
    team = make_team("serve", "Serving")
    start = week.start + timedelta(days=1)
    evaluation = Evaluation(duration_s=86_400.0, gpu_hours=96.0, sharing=SHARING)
    job = Job.objects.create(
        team=team, external_id="S-1", started_at=start, ended_at=start + timedelta(days=1), gpu_count=8,
        gpu_model=GpuModel.objects.get(name="H100 SXM"),
        gpu_hours=96.0, cost_usd=660.48, cost_per_day_usd=660.48, waste_per_day_usd=182.94,
        waste_lower_bound_per_day_usd=182.94, mfu=0.2, status=Job.Status.FINALIZED,
        evaluation=encode(evaluation),
    )  # fmt: skip
    return team, job


def test_the_job_total_is_a_days_waste(shared_job: tuple[Team, Job]) -> None:
    _, job = shared_job
    assert job_waste_total(Job.objects.get(pk=job.pk)).usd == pytest.approx(182.94)


def test_the_leaderboard_counts_gpu_equivalents_not_the_gpu_count(
    shared_job: tuple[Team, Job], week: Period
) -> None:
    team, _ = shared_job
    row = next(r for r in team_rows(week) if r.team_id == team.pk)
    assert row.gpu_hours == pytest.approx(96.0)
    # Cost and waste: $/day x 24 h / 24 = one day's worth.
    assert row.cost_usd == pytest.approx(660.48) and row.waste_lower_bound_usd == pytest.approx(182.94)
    assert row.weighted_mfu == pytest.approx(0.2)
    (worst,) = worst_jobs(week, team_id=team.pk)
    assert worst.gpu_h == pytest.approx(96.0)  # type: ignore[attr-defined]
