"""Alert rules (jobs.alerts.rules) on hand-made recent series: pure, no database."""

from __future__ import annotations

import numpy as np

from jobs.alerts import rules
from jobs.alerts.rules import FindingView, JobView, RuleConfig, Series, State

T0 = 1_800_000_000.0
STEP = 30.0


def _ts(n: int) -> np.ndarray:
    return T0 + STEP * np.arange(1, n + 1)


def _view(n: int = 60, **series: np.ndarray) -> JobView:
    ts = _ts(n)
    return JobView(
        now=float(ts[-1]),
        started_at=T0,
        data_until=float(ts[-1]),
        gpu_count=8,
        series={
            k.replace("__", "."): Series(ts, np.asarray(v, dtype=float), STEP) for k, v in series.items()
        },
        max_clock_mhz=1980.0,
        reference_mfu=0.45,
    )


def test_idle_after_earlier_activity_fires_once_held_for_the_minimum():
    # 40 busy samples (20 min), then 20 idle samples (10 min) on the least busy GPU.
    low = np.r_[np.full(40, 0.97), np.zeros(20)]
    high = np.full(60, 0.99)
    view = _view(gpu_util__min=low, gpu_util__max=high)
    fired = rules.gpus_idle(view, RuleConfig(1, 10))
    assert fired.state is State.FIRING
    # The run starts at the window closed by sample 41: T0 + 40 * 30 s.
    assert fired.since == T0 + 40 * STEP
    assert "idle for 10 min" in fired.title
    assert dict((e[0], e[1]) for e in fired.evidence)["busiest GPU before it went idle"] == 99.0
    assert rules.gpus_idle(view, RuleConfig(1, 15)).state is State.PENDING


def test_idle_clears_when_the_latest_sample_is_busy_and_missing_data_is_unknown():
    low = np.r_[np.zeros(50), np.full(10, 0.9)]
    assert rules.gpus_idle(_view(gpu_util__min=low), RuleConfig(1, 5)).state is State.CLEAR
    assert rules.gpus_idle(_view(gpu_util__min=np.full(60, np.nan)), RuleConfig(1, 5)).state is State.UNKNOWN
    assert rules.gpus_idle(_view(), RuleConfig(1, 5)).state is State.UNKNOWN


def test_a_gap_inside_an_idle_run_neither_breaks_nor_resets_it():
    low = np.r_[np.full(20, 0.9), np.zeros(20), np.full(5, np.nan), np.zeros(15)]
    v = rules.gpus_idle(_view(gpu_util__min=low), RuleConfig(1, 15))
    assert v.state is State.FIRING and v.since == T0 + 20 * STEP


def test_mfu_below_the_reference_share_or_the_baseline_band():
    mfu = np.r_[np.full(20, 0.44), np.full(40, 0.20)]
    view = _view(mfu__mean=mfu)
    v = rules.mfu_low(view, RuleConfig(0.7, 15))  # limit 0.7 x 45 % = 31.5 %
    assert v.state is State.FIRING and v.since == T0 + 20 * STEP
    banded = JobView(**{**{f: getattr(view, f) for f in view.__slots__}, "baseline_mfu_low": 0.15})
    assert rules.mfu_low(banded, RuleConfig(0.7, 15)).state is State.CLEAR
    unknown = JobView(**{**{f: getattr(view, f) for f in view.__slots__}, "reference_mfu": None})
    assert rules.mfu_low(unknown, RuleConfig(0.7, 15)).state is State.UNKNOWN


def test_throttling_needs_busy_gpus_with_a_low_clock():
    util = np.full(60, 0.98)
    clock = np.r_[np.full(30, 1950.0), np.full(30, 1300.0)]  # 1300 / 1980 = 66 %
    # Every GPU busy (the cross-GPU minimum too): without per-GPU clocks the mean is the busy GPUs' clock.
    v = rules.throttling(
        _view(gpu_util__mean=util, gpu_util__min=util, sm_clock__mean=clock), RuleConfig(0.85, 10)
    )
    assert v.state is State.FIRING and v.since == T0 + 30 * STEP
    idle = rules.throttling(_view(gpu_util__mean=np.zeros(60), sm_clock__mean=clock), RuleConfig(0.85, 10))
    assert idle.state is State.CLEAR  # idle GPUs clock down: not throttling


def test_xid_opens_at_once_and_resolves_after_quiet_minutes():
    xid = np.zeros(60)
    xid[50:53] = 1
    v = rules.xid_errors(_view(xid_errors__nonzero=xid), RuleConfig(1, 15))
    assert v.state is State.FIRING and v.since == T0 + 50 * STEP
    xid2 = np.zeros(60)
    xid2[5:8] = 1
    assert rules.xid_errors(_view(xid_errors__nonzero=xid2), RuleConfig(1, 15)).state is State.CLEAR


def _with_findings(*findings: FindingView) -> JobView:
    view = _view()
    return JobView(**{**{f: getattr(view, f) for f in view.__slots__}, "findings": findings})


def test_waste_fires_on_a_finding_above_the_threshold_and_unknown_never_fires():
    now = _view().now
    big = FindingView("idle_gpus", "2 GPUs idle", 900.0, 0.9, now - 1200)
    unknown = FindingView("throttling", "throttled", None, 0.9, now - 1200)
    v = rules.waste(_with_findings(big, unknown), RuleConfig(500, 10))
    assert v.state is State.FIRING and v.finding_code == "idle_gpus"
    assert rules.waste(_with_findings(unknown), RuleConfig(500, 10)).state is State.CLEAR
    assert rules.waste(_with_findings(big), RuleConfig(500, 30)).state is State.PENDING


def test_straggler_from_the_finding_with_enough_confidence_and_a_recent_window():
    now = _view().now
    recent = FindingView("straggler", "GPU 3 lags", 100.0, 0.8, now - 3600, ((now - 1800, now),))
    old = FindingView("straggler", "GPU 3 lagged", 100.0, 0.8, now - 3600, ((now - 3600, now - 3000),))
    assert rules.straggler(_with_findings(recent), RuleConfig(0.5, 10)).state is State.FIRING
    assert rules.straggler(_with_findings(old), RuleConfig(0.5, 10)).state is State.CLEAR
    assert rules.straggler(_with_findings(recent), RuleConfig(0.9, 10)).state is State.CLEAR


def test_ingestion_stale_by_the_age_of_the_archived_data():
    view = _view()
    stale = JobView(
        **{**{f: getattr(view, f) for f in view.__slots__}, "now": view.now + 900, "ingest_error": "x"}
    )
    v = rules.ingestion_stale(stale, RuleConfig(1, 10))
    assert v.state is State.FIRING and v.since == view.data_until
    assert rules.ingestion_stale(view, RuleConfig(1, 10)).state is State.CLEAR
