"""The alert rules' own reads after each poll: the baseline band from the active baseline's stats alone,
the findings as the columns the rules read (#14: fewer rows built per job and cycle)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from jobs.alerts import incidents
from jobs.evaluation.baselines import active_baseline
from jobs.evaluation.robust import Summary, check_regression
from jobs.models import Baseline, Finding, Job

START = datetime(2026, 1, 1, tzinfo=UTC)
MFU = {"median": 0.40, "mad": 0.02, "iqr": 0.03, "n": 5, "min": 0.35, "max": 0.44}


def _job(make_team, fingerprint: str = "fp-1") -> Job:
    return Job.objects.create(external_id="r1", name="j", team=make_team("llm"), gpu_count=8,
                              started_at=START, config_fingerprint=fingerprint)  # fmt: skip


@pytest.mark.django_db
def test_the_baseline_band_is_the_active_baselines_and_ignores_retired_ones(make_team):
    job = _job(make_team)
    team = job.team
    Baseline.objects.create(fingerprint="fp-1", model_name="m", team=team, retired_at=START,
                            stats={"mfu": {**MFU, "median": 0.9}})  # fmt: skip
    active = Baseline.objects.create(fingerprint="fp-1", model_name="m", team=team, stats={"mfu": MFU})
    active.runs.add(job)
    assert active_baseline(job) == active
    expected = check_regression(0.40, Summary(median=0.40, mad=0.02, iqr=0.03, n=5, min=0.35, max=0.44))
    assert incidents._baseline_mfu_low(job) == expected.band_low is not None


@pytest.mark.django_db
def test_no_fingerprint_or_no_mfu_stats_means_no_band(make_team):
    assert incidents._baseline_mfu_low(_job(make_team, fingerprint="")) is None
    job = Job.objects.create(external_id="r2", name="j", team=make_team("llm"), gpu_count=8,
                             started_at=START, config_fingerprint="fp-2")  # fmt: skip
    Baseline.objects.create(fingerprint="fp-2", model_name="m", team=job.team, stats={"tps": {"median": 1}})
    assert incidents._baseline_mfu_low(job) is None


@pytest.mark.django_db
def test_findings_reach_the_rules_with_their_windows_in_the_findings_order(make_team):
    job = _job(make_team)
    Finding.objects.create(job=job, code="low_mfu", title="Low MFU", waste_per_day_usd=10.0, confidence=0.5,
                           windows=[[1.0, 2.0], "bad", [3.0]])  # fmt: skip
    Finding.objects.create(job=job, code="idle_gpus", title="Idle", waste_per_day_usd=50.0, confidence=0.9)
    views = incidents._findings(job)
    # The model's order (largest waste first); only well-formed (start, end) windows are kept.
    assert [v.code for v in views] == ["idle_gpus", "low_mfu"]
    assert views[1].windows == ((1.0, 2.0),)
    assert views[0].waste_per_day_usd == 50.0 and views[0].confidence == 0.9
    first_seen = Finding.objects.get(code="idle_gpus").first_seen_at
    assert views[0].first_seen == first_seen.timestamp()
