"""Issue 27 item 3: the leaderboard's SQL (jobs/outputs/leaderboard.py: period_rows, worst_jobs) computes
GPU-hours, cost, waste and team MFU inside a period exactly as jobs/evaluation/totals.py defines them.

The leaderboard keeps its SQL for speed (one pass for all periods); these tests make it a copy of the one
definition rather than a second one. The sample jobs cover what the definitions distinguish: shared GPUs
(GPU-equivalents below the GPU count), a MIG slice (peak-equivalents differ from GPU-equivalents), a job
still running (its window ends at now), a job spanning two weeks, no price (none when evaluated, and no book
for the job's GPU model and tier), waste unknown with an idle lower bound, waste unknown without one, no
MFU, a price change mid-run and mid-period, a run that starts before its book does, a spot job beside
on-demand ones of the same GPU model, and a job priced at $0/day whose earlier hours were not free.

Cost inside a period is the dated price book (jobs.evaluation.totals.cost_inside), the definition of the
job's own total cost, so adjacent periods add up to `Job.cost_usd` as the evaluation stored it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from jobs.evaluation.load import prices_for
from jobs.evaluation.schema import Evaluation, GpuSharing, encode
from jobs.evaluation.totals import (
    JobRates,
    cost_inside,
    gpu_hours_inside,
    hours_inside,
    waste_inside,
    weighted_mfu,
)
from jobs.models import GpuModel, Job, PriceEntry, Team
from jobs.outputs.leaderboard import Period, iso_week, period_rows, worst_jobs
from jobs.templatetags.units import job_waste_total

SHARED = GpuSharing(share=0.5, gpu_equivalents=4.0, peak_equivalents=4.0, label="time-sliced")
# A 3g.40gb MIG slice on each of 2 H100s: 3/7 of each GPU's cost, 3 x 16 of 132 SMs of its peak.
MIG = GpuSharing(share=3 / 7, gpu_equivalents=6 / 7, peak_equivalents=2 * 48 / 132, label="MIG 3g.40gb")


def _rates(job: Job, now: datetime) -> JobRates:
    """The job as the totals read it, its price book looked up as the evaluation looks it up."""
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
        prices=tuple(prices_for(job)[0]),
    )


def _book(gpu: GpuModel, tier: str, *prices: tuple[datetime, float]) -> None:
    """Replace the seeded book of one GPU model and tier: the tests' dates move with today's, the seed's
    do not."""
    PriceEntry.objects.filter(gpu_model=gpu, tier=tier).delete()
    for when, usd in prices:
        PriceEntry.objects.create(gpu_model=gpu, tier=tier, effective_from=when, usd_per_gpu_hour=usd)


@pytest.fixture
def sample(
    db: None, make_team: Callable[..., Team], catalog: object
) -> tuple[list[Period], datetime, list[Job]]:
    week = iso_week(timezone.now().date() - timedelta(days=21))
    before = week.previous()
    now = week.start + timedelta(days=4, hours=7, minutes=13)  # "now" inside the week: J-run is cut there
    llm, serve = make_team("llm", "LLM"), make_team("serve", "Serving")
    w = week.start
    h100, a100 = GpuModel.objects.get(name="H100 SXM"), GpuModel.objects.get(name="A100 SXM 80GB")
    h200, b200 = GpuModel.objects.get(name="H200 SXM"), GpuModel.objects.get(name="B200")
    long_ago = w - timedelta(days=60)
    _book(h100, "on_demand", (long_ago, 6.88))
    _book(h100, "spot", (long_ago, 2.46))
    _book(a100, "on_demand", (long_ago, 3.43))
    # H200 on-demand drops from $7.91 to $5.00 a day and 6 hours into the week (mid-run, mid-period).
    _book(h200, "on_demand", (long_ago, 7.91), (w + timedelta(days=1, hours=6), 5.0))
    # B200 spot's book starts 12 hours into the week, after J-early started: its earliest price covers it.
    _book(b200, "spot", (w + timedelta(hours=12), 4.0), (w + timedelta(days=5), 9.0))
    _book(h200, "reserved")  # no book for this tier at all
    # On-prem H200 was $1.00 until two days into the week, then $0: a job evaluated after is at $0/day.
    _book(h200, "on_prem", (long_ago, 1.0), (w + timedelta(days=2), 0.0))

    def job(team: Team, ext: str, start: datetime, end: datetime | None, gpus: int, **kw: object) -> Job:
        sharing = kw.pop("sharing", None)
        duration = ((end or now) - start).total_seconds()
        evaluation = Evaluation(duration_s=duration, gpu_hours=gpus * duration / 3600, sharing=sharing)  # type: ignore[arg-type]
        kw.setdefault("gpu_model", h100)
        return Job.objects.create(
            team=team, external_id=ext, started_at=start, ended_at=end, gpu_count=gpus,
            status=Job.Status.FINALIZED if end else Job.Status.RUNNING, evaluation=encode(evaluation), **kw,
        )  # fmt: skip

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
            waste_per_day_usd=20.0, waste_lower_bound_per_day_usd=12.0, mfu=0.5, gpu_model=a100),
        # Price changed mid-run and mid-week; spans both weeks; its stored rate is the latest price's.
        job(serve, "J-change", w - timedelta(days=1), w + timedelta(days=2), 8, gpu_model=h200,
            cost_per_day_usd=8 * 5.0 * 24, waste_per_day_usd=240.0, waste_lower_bound_per_day_usd=100.0,
            mfu=0.3),
        # Started before its tier's book does; MFU unknown, waste "at least" its idle share of the cost.
        job(serve, "J-early", w - timedelta(days=2), w + timedelta(days=1), 2, gpu_model=b200,
            price_tier="spot", cost_per_day_usd=2 * 4.0 * 24, waste_lower_bound_per_day_usd=48.0, mfu=None),
        # Spot beside on-demand on the same GPU model (S-1, S-2): the spot book prices it.
        job(serve, "S-spot", w + timedelta(days=2), w + timedelta(days=2, hours=10), 1, price_tier="spot",
            cost_per_day_usd=2.46 * 24, waste_per_day_usd=2.46 * 24 * 0.25, mfu=0.3),
        # Evaluated with a price, but its tier has no book now: the cost is unknown, not $0.
        job(serve, "S-nobook", w + timedelta(days=1), w + timedelta(days=1, hours=5), 2, gpu_model=h200,
            price_tier="reserved", cost_per_day_usd=300.0, waste_per_day_usd=30.0, mfu=0.4),
        # $0/day when evaluated, but its first day was at $1.00: the share wasted is unknown there.
        job(serve, "S-free", w + timedelta(days=1), w + timedelta(days=3), 4, gpu_model=h200,
            price_tier="on_prem", cost_per_day_usd=0.0, waste_per_day_usd=0.0, mfu=0.2),
        # Waste unknown without even an idle lower bound.
        job(serve, "S-1", w - timedelta(days=1), w + timedelta(hours=20), 1, cost_per_day_usd=165.12,
            mfu=None),
        job(serve, "S-2", w + timedelta(days=3), w + timedelta(days=3, hours=1), 16, cost_per_day_usd=2641.92,
            waste_per_day_usd=900.0, waste_lower_bound_per_day_usd=100.0, mfu=0.31),
    ]  # fmt: skip
    return [before, week], now, jobs


def _expected(jobs: list[Job], period: Period, now: datetime) -> dict[int, dict[str, object]]:
    out: dict[int, dict[str, object]] = defaultdict(
        lambda: {"gpu_hours": 0.0, "cost": 0.0, "waste": 0.0, "mfu_items": [], "jobs": 0, "cost_unknown": 0,
                 "waste_unknown": 0, "share_unknown": 0}
    )  # fmt: skip
    for job in jobs:
        rates = _rates(job, now)
        if hours_inside(rates.started, rates.stopped, period.start, period.end) <= 0:
            continue
        row = out[job.team_id]
        row["jobs"] += 1  # type: ignore[operator]
        row["gpu_hours"] += gpu_hours_inside(rates, period.start, period.end)  # type: ignore[operator]
        cost = cost_inside(rates, period.start, period.end)
        row["cost"] += cost or 0.0  # type: ignore[operator]
        row["cost_unknown"] += cost is None  # type: ignore[operator]
        waste = waste_inside(rates, period.start, period.end)
        row["waste"] += waste.usd or 0.0  # type: ignore[operator]
        row["waste_unknown"] += waste.usd is None or waste.lower_bound  # type: ignore[operator]
        row["share_unknown"] += cost is not None and waste.usd is None and "$0/day" in waste.reason  # type: ignore[operator]
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
            assert got.jobs_cost_unknown == want["cost_unknown"]
            assert got.jobs_waste_unknown == want["waste_unknown"]
            assert got.jobs_waste_share_unknown == want["share_unknown"]
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


def test_the_job_pages_total_waste_is_the_waste_inside_its_whole_run_even_across_a_price_change(
    sample: tuple[list[Period], datetime, list[Job]],
) -> None:
    # The job page's total waste (templatetags.units.job_waste_total -> costs.total_waste) is the wasted
    # share of the job's stored total cost from the dated book: the same rule as a period's waste
    # (costs.waste_of_cost), so it equals the waste inside the whole run for the jobs whose price changed
    # (J-change), that started before their book (J-early) and that were priced at $0 (S-free) too. Only
    # S-nobook is left out: its book was deleted after its evaluation stored a total, so the period SQL
    # (reading the book as it is now) no longer prices it while its stored total stands.
    _, now, jobs = sample
    for job in jobs:
        if job.external_id == "S-nobook":
            continue
        job = Job.objects.get(pk=job.pk)
        rates = _rates(job, now)
        # The total the evaluation stores (kpis._cost: the book's cost of the run; the test below pins that
        # on a real evaluation); the fixture's jobs carry only their rates.
        job.cost_usd = cost_inside(rates, rates.started, rates.stopped)
        whole = waste_inside(rates, rates.started, rates.stopped)
        shown = job_waste_total(job)
        if whole.usd is None:
            assert shown.usd is None, job.external_id
        else:
            assert shown.usd == pytest.approx(whole.usd, rel=1e-9), job.external_id
            assert shown.lower_bound == whole.lower_bound, job.external_id


def test_with_the_default_tier_set_to_spot_an_untiered_job_is_priced_from_the_spot_book(
    sample: tuple[list[Period], datetime, list[Job]], settings: object
) -> None:
    # The SQL takes the default tier as a parameter (as prices_for reads settings.DEFAULT_PRICE_TIER):
    # untiered H100 jobs now price at H100 spot's $2.46, the A100 and H200 ones have no spot book.
    settings.DEFAULT_PRICE_TIER = "spot"  # type: ignore[attr-defined]
    periods, now, jobs = sample
    rows = period_rows(periods, now)
    for period, by_team in zip(periods, rows, strict=True):
        for team_id, want in _expected(jobs, period, now).items():
            assert by_team[team_id].cost_usd == pytest.approx(want["cost"], rel=1e-9)
            assert by_team[team_id].jobs_cost_unknown == want["cost_unknown"]
    span = next(j for j in jobs if j.external_id == "J-span")
    rates = _rates(span, now)
    assert cost_inside(rates, periods[1].start, periods[1].end) == pytest.approx(4 * 27 * 2.46)


def test_a_price_change_moves_a_past_periods_cost_only_for_the_hours_after_it(
    sample: tuple[list[Period], datetime, list[Job]],
) -> None:
    # J-span: 4 GPU-equivalents of H100 on-demand, 53 h in the week before and 27 h in the week. A new
    # price ($10.00) from 20 h into the week adds 4 x 7 h x (10.00 - 6.88) to the week and nothing before.
    periods, now, _ = sample
    week = periods[1]
    llm = Team.objects.get(slug="llm")
    old = [rows[llm.pk].cost_usd for rows in period_rows(periods, now)]
    old_worst = {j.external_id: j.waste_in_period for j in worst_jobs(week, limit=20, now=now)}  # type: ignore[attr-defined]
    h100 = GpuModel.objects.get(name="H100 SXM")
    PriceEntry.objects.create(
        gpu_model=h100, tier="on_demand", effective_from=week.start + timedelta(hours=20), usd_per_gpu_hour=10
    )
    new = [rows[llm.pk].cost_usd for rows in period_rows(periods, now)]
    # J-run (2 GPUs from 48 h into the week until now) is all after the change: 2 x 55.2167 h x 3.12 more.
    run_h = (now - (week.start + timedelta(days=2))).total_seconds() / 3600
    assert new[0] == pytest.approx(old[0], rel=1e-12)
    assert new[1] - old[1] == pytest.approx((4 * 7 + 2 * run_h) * (10.0 - 6.88), rel=1e-9)
    # The worst jobs' waste follows: J-span's share (182.94 / 660.48) of 4 x 7 h x 3.12 more.
    new_worst = {j.external_id: j.waste_in_period for j in worst_jobs(week, limit=20, now=now)}  # type: ignore[attr-defined]
    assert new_worst["J-span"] - old_worst["J-span"] == pytest.approx(
        182.94 / 660.48 * 4 * 7 * 3.12, rel=1e-9
    )
    assert new_worst["J-a100"] == pytest.approx(old_worst["J-a100"], rel=1e-12)  # another GPU model's book


def test_adjacent_periods_costs_add_up_to_the_cost_the_evaluation_stored(
    db: None, make_team: Callable[..., Team], catalog: object, settings: object
) -> None:
    # A job registered and evaluated as in production (jobs.pipeline.refresh.reevaluate), whose run starts
    # before its book does and crosses a price change: the weeks covering it add up to its Job.cost_usd.
    from jobs.api.serializers import JobRegisterSerializer
    from jobs.intake.registry import register_job
    from jobs.pipeline.refresh import reevaluate
    from tests.conftest import job_body

    settings.DEFAULT_PRICE_TIER = "on_demand"  # type: ignore[attr-defined]
    make_team("llm")
    week = iso_week(timezone.now().date() - timedelta(days=21))
    h100 = GpuModel.objects.get(name="H100 SXM")
    _book(h100, "on_demand", (week.start - timedelta(days=3), 6.0), (week.start + timedelta(hours=29), 4.5))
    start, end = week.start - timedelta(days=4, hours=-3), week.start + timedelta(days=2, hours=7)
    body = JobRegisterSerializer(
        data=job_body("adds-up", started_at=start.isoformat(), ended_at=end.isoformat(), price_tier="")
    )
    body.is_valid(raise_exception=True)
    job = register_job(body.validated_data).job
    job.status = Job.Status.FINALIZED
    job.save()
    job = reevaluate(job.pk, diagnose=False)
    assert job.cost_usd is not None and job.gpu_model_id == h100.pk
    # By hand: 8 GPUs over 148 h, 122 h at $6.00 (the first 21 h before the book starts) and 26 h at $4.50.
    assert job.cost_usd == pytest.approx(8 * (122 * 6.0 + 26 * 4.5), rel=1e-9)
    periods = [week.previous(), week]
    rows = period_rows(periods, now=timezone.now())
    assert sum(r[job.team_id].cost_usd for r in rows) == pytest.approx(job.cost_usd, rel=1e-9)
    rates = _rates(job, timezone.now())
    assert sum(cost_inside(rates, p.start, p.end) or 0.0 for p in periods) == pytest.approx(
        job.cost_usd, rel=1e-9
    )
    # The old spread (today's $/day x hours) would have said 8 x 4.50 x 148 h: a different figure.
    rate = job.cost_per_day_usd
    assert rate == pytest.approx(8 * 4.5 * 24)
    assert rate is not None and rate / 24 * 148 != pytest.approx(job.cost_usd, rel=1e-3)
