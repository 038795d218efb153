"""Issue 25 item 4: the throttling alert judges busy GPUs only, and the idle alert and the idle_gpus finding
read one idle computation (jobs.diagnosis.idle). Pure: hand-made per-GPU rows, no database."""

from __future__ import annotations

import numpy as np
import pytest

from jobs.alerts import rules
from jobs.alerts.rules import JobView, PerGpu, RuleConfig, Series, State
from jobs.diagnosis import DiagnosisInput
from jobs.diagnosis.features import Features
from jobs.diagnosis.idle import idle_stretches
from jobs.diagnosis.rules import RULES
from jobs.metrics.signals import COUNT, MAX, MEAN, MIN, GpuKey, JobSignals, SignalSeries

T0 = 1_800_000_000.0
STEP = 30.0
N = 120  # one hour at 30 s
TS = T0 + STEP * np.arange(1, N + 1)
IDLE_CLOCK, BOOST = 210.0, 1980.0


def _job(busy_clock: float) -> tuple[np.ndarray, np.ndarray]:
    """8 GPUs for an hour; GPUs 6 and 7 go idle for the last 25 min (50 samples), parking their clock at
    210 MHz; the busy GPUs read 98 % at `busy_clock`."""
    util = np.full((8, N), 0.98)
    clock = np.full((8, N), busy_clock)
    util[6:, -50:] = 0.0
    clock[6:, -50:] = IDLE_CLOCK
    return util, clock


def _view(util: np.ndarray, clock: np.ndarray, *, per_gpu: bool) -> JobView:
    series = {
        "gpu_util.mean": Series(TS, util.mean(axis=0), STEP),
        "gpu_util.min": Series(TS, util.min(axis=0), STEP),
        "gpu_util.max": Series(TS, util.max(axis=0), STEP),
        "sm_clock.mean": Series(TS, clock.mean(axis=0), STEP),
    }
    return JobView(
        now=float(TS[-1]), started_at=T0, data_until=float(TS[-1]), gpu_count=8, series=series,
        per_gpu=PerGpu(TS, STEP, util, None, clock) if per_gpu else None, max_clock_mhz=BOOST,
    )  # fmt: skip


def test_idle_gpus_do_not_make_busy_gpus_look_throttled() -> None:
    util, clock = _job(BOOST)
    # The old reading: mean clock (6 x 1980 + 2 x 210) / 8 = 1,537.5 MHz = 77.7 % of boost < 85 %, mean
    # util 6 x 0.98 / 8 = 0.735 > 0.5: "Busy GPUs throttled for 25 min".
    assert clock.mean(axis=0)[-1] == pytest.approx(1537.5)
    v = rules.throttling(_view(util, clock, per_gpu=True), RuleConfig(0.85, 10))
    assert v.state is State.CLEAR
    # Without per-GPU clocks, samples with an idle GPU are not judged (the mean mixes idle clocks).
    assert not rules.throttling(_view(util, clock, per_gpu=False), RuleConfig(0.85, 10)).holds


def test_busy_gpus_that_are_throttled_still_fire() -> None:
    util, clock = _job(1300.0)  # 1300 / 1980 = 65.7 % on every busy GPU
    v = rules.throttling(_view(util, clock, per_gpu=True), RuleConfig(0.85, 10))
    assert v.state is State.FIRING and v.since == T0  # the whole hour: the window the first sample closes
    assert dict((e[0], e[1]) for e in v.evidence)["SM clock / max boost"] == pytest.approx(65.7, abs=0.05)
    # Even when most GPUs are idle (mean util 0.37 < 0.5), the three busy ones are judged.
    util[:5, -50:] = 0.0
    v = rules.throttling(_view(util, clock, per_gpu=True), RuleConfig(0.85, 10))
    assert v.state is State.FIRING


def test_busy_clock_averages_only_busy_gpus() -> None:
    util = np.array([[0.9, 0.0, np.nan], [0.2, 0.0, 0.8]])
    clock = np.array([[1900.0, 300.0, 1800.0], [600.0, 300.0, np.nan]])
    out = rules.busy_clock(PerGpu(np.arange(3.0), 1.0, util, None, clock), 0.5)
    assert out is not None and out[0] == 1900.0 and np.isnan(out[1]) and np.isnan(out[2])


def _diagnosis_input(util: np.ndarray) -> DiagnosisInput:
    sigs = JobSignals(float(TS[0]), float(TS[-1]), STEP, TS)
    stats = {MEAN: util.mean(axis=0), MIN: util.min(axis=0), MAX: util.max(axis=0), COUNT: np.full(N, 8.0)}
    series = SignalSeries("gpu_util", "ratio", TS, stats)
    series.gpus = tuple(GpuKey("node-a", str(i)) for i in range(8))
    series.gpu_timestamps, series.per_gpu = TS, util
    sigs.signals["gpu_util"] = series
    return DiagnosisInput(signals=sigs, gpu_count=8)


def test_the_idle_alert_and_the_idle_finding_name_the_same_gpus_and_minutes() -> None:
    util, clock = _job(BOOST)
    util[7, -20] = np.nan  # a lost scrape inside GPU 7's stretch: bridged by both, idle time by neither
    # 50 samples x 30 s = 25 min on GPUs 6 and 7.
    found = idle_stretches(util, TS, STEP)
    assert [s.gpu for s in found.trailing()] == [6, 7]
    assert {s.seconds for s in found.stretches} == {1500.0}
    alert = rules.gpus_idle(_view(util, clock, per_gpu=True), RuleConfig(1, 15))
    assert alert.state is State.FIRING and alert.title == "2 of 8 GPUs idle for 25 min"
    finding = RULES["idle_gpus"](_diagnosis_input(util), Features(_diagnosis_input(util)))
    assert finding is not None and finding.title == "2 of 8 GPUs idle (~0 % utilisation) for 25 min or more"
    # 99 observed idle GPU-samples of 959 observed: 10.3 % of the GPU time.
    assert found.idle_samples == 99 and found.known_samples == 959
    assert {e.label: e.value for e in finding.evidence}["share of the job's GPU time idle"] == 10.3


def test_the_idle_alert_needs_the_threshold_gpus_idle_together() -> None:
    util, clock = _job(BOOST)
    util[7, -50:] = 0.98  # only GPU 6 is idle
    view = _view(util, clock, per_gpu=True)
    assert rules.gpus_idle(view, RuleConfig(2, 15)).state is State.CLEAR
    one = rules.gpus_idle(view, RuleConfig(1, 15))
    assert one.state is State.FIRING and one.title == "1 of 8 GPUs idle for 25 min"
    assert rules.gpus_idle(view, RuleConfig(1, 30)).state is State.PENDING


def test_per_gpu_rows_must_share_a_grid() -> None:
    with pytest.raises(ValueError, match="not on GPU_UTIL's grid"):
        PerGpu(TS, STEP, np.zeros((8, N)), None, np.zeros((7, N)))


def _aggregate_input(util: np.ndarray, clock: np.ndarray) -> DiagnosisInput:
    """Cross-GPU statistics only (no per-GPU rows), as a job whose per-GPU series are not archived."""
    sigs = JobSignals(float(TS[0]), float(TS[-1]), STEP, TS)
    for key, unit, values in (("gpu_util", "ratio", util), ("sm_clock", "MHz", clock)):
        stats = {MEAN: values.mean(axis=0), MIN: values.min(axis=0), MAX: values.max(axis=0)}
        sigs.signals[key] = SignalSeries(key, unit, TS, stats)
    return DiagnosisInput(signals=sigs, gpu_count=8, max_clock_mhz=BOOST)


def test_the_throttling_finding_without_per_gpu_rows_ignores_parked_idle_clocks() -> None:
    util, clock = _job(BOOST)
    util[6:], clock[6:] = 0.0, IDLE_CLOCK  # GPUs 6 and 7 idle the whole hour: mean clock 1,537.5 MHz
    inp = _aggregate_input(util, clock)
    assert RULES["throttling"](inp, Features(inp)) is None
    # Every GPU busy at 1,300 MHz (65.7 % of boost): throttled.
    busy = _aggregate_input(np.full((8, N), 0.98), np.full((8, N), 1300.0))
    found = RULES["throttling"](busy, Features(busy))
    assert found is not None and {e.label: e.value for e in found.evidence}["clock / max boost"] == 65.7
