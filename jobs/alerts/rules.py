"""Alert rules: pure functions from a running job's recent state to a verdict per rule (no Django, no I/O).

Each rule reads what is already stored (the archive's recent cross-GPU aggregates, the stored evaluation's
reference MFU and the baseline band, the diagnosis' findings, the ingestion timestamps) and answers:

- FIRING: the condition has held for at least the rule's minimum duration (an incident opens / stays open);
- PENDING: the condition holds, but not for long enough yet (an open incident stays open);
- CLEAR: the condition does not hold at the latest sample (an open incident resolves);
- UNKNOWN: the data needed is missing (nothing changes: missing data is never "all clear").

"Since" is when the condition began, read from the data itself (the start of the trailing run of samples
meeting it, or the finding's first sighting), so the verdict needs no state between polls and repeated
polls give the same answer.

Definitions are not new: idle is the evaluation's GPU_UTIL <= IDLE_UTIL_MAX (jobs.diagnosis.thresholds,
passed in), MFU is the archived derived MFU series, the baseline band is jobs.evaluation.robust's. With the
recent per-GPU rows (`PerGpu`), the idle alert runs the idle_gpus finding's own computation
(jobs.diagnosis.idle.idle_stretches: the same GPUs, the same stretches and durations), and throttling
judges the SM clock of the GPUs that are busy in each sample only (an idle GPU parks its clock low; the
mean over all GPUs of a job with idle GPUs reads throttled although every busy GPU runs at its boost).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from jobs.diagnosis.idle import idle_stretches

GPUS_IDLE = "gpus_idle"
MFU_LOW = "mfu_low"
THROTTLING = "throttling"
XID_ERRORS = "xid_errors"
STRAGGLER = "straggler"
WASTE = "waste"
INGESTION_STALE = "ingestion_stale"
RULES = (GPUS_IDLE, MFU_LOW, THROTTLING, XID_ERRORS, STRAGGLER, WASTE, INGESTION_STALE)

#: The finding each rule points at (the waste rule points at the finding that exceeds the threshold).
FINDING_OF_RULE: dict[str, str] = {
    GPUS_IDLE: "idle_gpus",
    MFU_LOW: "baseline_regression",
    THROTTLING: "throttling",
    XID_ERRORS: "gpu_errors",
    STRAGGLER: "straggler",
}


class State(StrEnum):
    FIRING = "firing"
    PENDING = "pending"
    CLEAR = "clear"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class RuleConfig:
    """A rule's threshold (its unit depends on the rule) and the minutes the condition must hold."""

    threshold: float
    minutes: float


@dataclass(frozen=True, slots=True)
class FindingView:
    """What a rule needs of a stored finding."""

    code: str
    title: str
    waste_per_day_usd: float | None
    confidence: float
    first_seen: float  # unix seconds
    windows: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Series:
    """One recent aggregate line on a grid (NaN = no sample); `step` is the grid's step in seconds."""

    timestamps: np.ndarray
    values: np.ndarray
    step: float


@dataclass(frozen=True, slots=True)
class PerGpu:
    """Recent per-GPU rows on one grid (GPUs x time, NaN = no sample): GPU_UTIL as a ratio, and where
    archived GR_ENGINE_ACTIVE (ratio) and the SM clock (MHz) on the same grid and GPU order."""

    timestamps: np.ndarray
    step: float
    util: np.ndarray
    gr_engine_active: np.ndarray | None = None
    sm_clock: np.ndarray | None = None

    def __post_init__(self) -> None:
        shape = np.shape(self.util)
        for name in ("gr_engine_active", "sm_clock"):
            other = getattr(self, name)
            if other is not None and np.shape(other) != shape:
                raise ValueError(f"per-GPU {name} {np.shape(other)} is not on GPU_UTIL's grid {shape}")
        if len(shape) != 2 or shape[1] != np.size(self.timestamps):
            raise ValueError(f"per-GPU GPU_UTIL {shape} does not match {np.size(self.timestamps)} timestamps")


@dataclass(frozen=True, slots=True)
class JobView:
    """A running job's recent state, as the rules read it."""

    now: float
    started_at: float
    data_until: float | None
    ingest_error: str = ""
    gpu_count: int = 1
    #: Recent aggregates keyed "signal.stat": gpu_util.min/max/mean, mfu.mean, sm_clock.mean,
    #: power_violation.mean, thermal_violation.mean, xid_errors.nonzero.
    series: Mapping[str, Series] = field(default_factory=dict)
    #: GPUs idle in their latest per-GPU sample (None: per-GPU rows not available).
    idle_gpus_now: int | None = None
    #: Recent per-GPU rows (None: not read or not archived): the idle and throttling rules prefer them.
    per_gpu: PerGpu | None = None
    idle_util_max: float = 0.05
    max_clock_mhz: float | None = None
    busy_util_min: float = 0.5
    violation_share: float = 0.3
    reference_mfu: float | None = None
    reference_source: str = ""
    baseline_mfu_low: float | None = None
    findings: Sequence[FindingView] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    """One rule's answer for one job."""

    rule: str
    state: State
    title: str = ""
    since: float | None = None
    finding_code: str = ""
    evidence: tuple[tuple[str, float | str, str], ...] = ()
    reason: str = ""

    @property
    def holds(self) -> bool:
        """The condition holds now (firing or still pending)."""
        return self.state in (State.FIRING, State.PENDING)


# ------------------------------------------------------------------------------------------- helpers


def trailing_run(series: Series, condition: np.ndarray) -> tuple[State, float | None, float | None]:
    """(CLEAR|PENDING-ish|UNKNOWN, since, last) of the trailing run of samples meeting `condition`.

    Walks back from the latest sample with data: missing samples (NaN) inside a run neither break nor
    extend it. Returns UNKNOWN without any sample, CLEAR when the latest sample fails the condition,
    otherwise FIRING with `since` = the start of the window the run's first sample closes (sample time minus
    the step) and `last` = the latest sample's time; the caller compares the duration with the minimum.
    """
    finite = np.isfinite(series.values)
    idx = np.flatnonzero(finite)
    if idx.size == 0:
        return State.UNKNOWN, None, None
    last = int(idx[-1])
    if not bool(condition[last]):
        return State.CLEAR, None, float(series.timestamps[last])
    failing = idx[~condition[idx]]
    first = int(idx[idx > failing[-1]][0]) if failing.size else int(idx[0])
    return State.FIRING, float(series.timestamps[first]) - series.step, float(series.timestamps[last])


def _held(rule: str, since: float, until: float, cfg: RuleConfig) -> State:
    return State.FIRING if until - since >= cfg.minutes * 60.0 - 1e-6 else State.PENDING


def _minutes(seconds: float) -> float:
    return round(seconds / 60.0, 1)


def _get(view: JobView, key: str) -> Series | None:
    s = view.series.get(key)
    return s if s is not None and s.values.size else None


def _finding(view: JobView, code: str) -> FindingView | None:
    return next((f for f in view.findings if f.code == code), None)


# --------------------------------------------------------------------------------------------- rules


def gpus_idle(view: JobView, cfg: RuleConfig) -> Verdict:
    """At least `threshold` allocated GPUs at idle utilisation for `minutes`, whatever came before (a job
    that worked, then went idle, fires just as one idle from its start). With per-GPU rows: the GPUs whose
    idle stretch (jobs.diagnosis.idle, the idle_gpus finding's computation) is still going; without them,
    the trailing run of the cross-GPU minimum at or below the idle level."""
    if view.per_gpu is not None and np.isfinite(view.per_gpu.util).any():
        return _gpus_idle_per_gpu(view, view.per_gpu, cfg)
    low = _get(view, "gpu_util.min")
    if low is None:
        return Verdict(GPUS_IDLE, State.UNKNOWN, reason="no GPU_UTIL in the archive's recent window")
    state, since, last = trailing_run(low, low.values <= view.idle_util_max)
    need = int(cfg.threshold)
    if state is State.FIRING and need > 1 and view.idle_gpus_now is not None and view.idle_gpus_now < need:
        state = State.CLEAR
    if state is not State.FIRING or since is None or last is None:
        return Verdict(GPUS_IDLE, state)
    high = _get(view, "gpu_util.max")
    all_idle = high is not None and bool(
        np.nanmax(high.values[high.timestamps > since]) <= view.idle_util_max
    )
    count = view.gpu_count if all_idle else view.idle_gpus_now
    who = f"{count} of {view.gpu_count}" if count is not None else f"at least {need} of {view.gpu_count}"
    earlier = high.values[high.timestamps <= since] if high is not None else np.array([])
    earlier = earlier[np.isfinite(earlier)]
    extra = []
    if earlier.size:
        extra.append(("busiest GPU before it went idle", round(float(earlier.max()) * 100, 1), "%"))
    gpus = float(count) if count is not None else f">= {need}"
    return _idle_verdict(view, cfg, since, last, gpus, f"{who} GPUs idle", extra)


def _idle_verdict(
    view: JobView,
    cfg: RuleConfig,
    since: float,
    last: float,
    gpus: float | str,
    who: str,
    extra: Sequence[tuple[str, float | str, str]],
) -> Verdict:
    """The gpus_idle verdict both computations (cross-GPU aggregates, per-GPU rows) give: its evidence and
    title from the idle stretch [since, last] and how many GPUs were idle in it."""
    evidence: list[tuple[str, float | str, str]] = [
        ("GPUs idle", gpus, "GPUs"),
        ("idle for", _minutes(last - since), "min"),
        ("idle level (GPU_UTIL at or below)", round(view.idle_util_max * 100, 1), "%"),
        *extra,
    ]
    return Verdict(
        GPUS_IDLE,
        _held(GPUS_IDLE, since, last, cfg),
        title=f"{who} for {_minutes(last - since):g} min",
        since=since,
        finding_code=FINDING_OF_RULE[GPUS_IDLE],
        evidence=tuple(evidence),
    )


def _gpus_idle_per_gpu(view: JobView, pg: PerGpu, cfg: RuleConfig) -> Verdict:
    found = idle_stretches(
        pg.util, pg.timestamps, pg.step, busy_average=pg.gr_engine_active, min_len_s=0.0,
        threshold=view.idle_util_max,
    )  # fmt: skip
    now = found.trailing()
    need = max(int(cfg.threshold), 1)
    if len(now) < need:
        return Verdict(GPUS_IDLE, State.CLEAR)
    # A sample closes the window that ends at it: a stretch [ts[a], ts[b-1] + step] is the same span as
    # (ts[a] - step, ts[b-1]], the windows the aggregate rule and the other rules read.
    starts = sorted(s.window[0] - pg.step for s in now)
    since = starts[need - 1]  # from then on at least `need` GPUs were idle together
    last = max(s.window[1] for s in now) - pg.step
    count = len(now)
    how = ("idle computation", "per GPU, as the idle_gpus finding (GR_ENGINE_ACTIVE too where exported)", "")
    who = f"{count} of {view.gpu_count} GPUs idle"
    return _idle_verdict(view, cfg, since, last, float(count), who, [how])


def mfu_low(view: JobView, cfg: RuleConfig) -> Verdict:
    """MFU below the baseline band's low edge, or (no baseline) below `threshold` x the reference MFU."""
    mfu = _get(view, "mfu.mean")
    if view.baseline_mfu_low is not None:
        limit, against = view.baseline_mfu_low, "the baseline band"
    elif view.reference_mfu is not None:
        limit = cfg.threshold * view.reference_mfu
        against = f"{cfg.threshold:.0%} of the reference MFU {view.reference_mfu:.1%}"
    else:
        return Verdict(MFU_LOW, State.UNKNOWN, reason="no baseline and no reference MFU")
    if mfu is None:
        return Verdict(MFU_LOW, State.UNKNOWN, reason="MFU unknown (no throughput)")
    state, since, last = trailing_run(mfu, mfu.values < limit)
    if state is not State.FIRING or since is None or last is None:
        return Verdict(MFU_LOW, state)
    recent = mfu.values[(mfu.timestamps > since) & np.isfinite(mfu.values)]
    value = float(np.mean(recent))
    return Verdict(
        MFU_LOW,
        _held(MFU_LOW, since, last, cfg),
        title=f"MFU {value:.1%} below {against} for {_minutes(last - since):g} min",
        since=since,
        finding_code=FINDING_OF_RULE[MFU_LOW],
        evidence=(
            ("MFU (mean while below)", round(value * 100, 2), "%"),
            ("limit", round(limit * 100, 2), "%"),
            ("below for", _minutes(last - since), "min"),
        ),
    )


def busy_clock(pg: PerGpu, busy_util_min: float) -> np.ndarray | None:
    """Mean SM clock (MHz) over the GPUs busy (GPU_UTIL >= `busy_util_min`) in each sample; NaN where none
    is busy or none has a clock. None without per-GPU clocks."""
    if pg.sm_clock is None:
        return None
    util, clock = np.asarray(pg.util, dtype=np.float64), np.asarray(pg.sm_clock, dtype=np.float64)
    use = np.isfinite(util) & (np.nan_to_num(util) >= busy_util_min) & np.isfinite(clock)
    n = use.sum(axis=0)
    total = np.where(use, clock, 0.0).sum(axis=0)
    return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def _on_grid(values: np.ndarray, src: np.ndarray, dst: np.ndarray, step: float) -> np.ndarray:
    """`values` on timestamps `src` read at `dst` (the sample within half a step, else NaN)."""
    out = np.full(dst.size, np.nan)
    if src.size == 0:
        return out
    idx = np.clip(np.searchsorted(src, dst), 0, src.size - 1)
    prev = np.clip(idx - 1, 0, src.size - 1)
    best = np.where(np.abs(src[prev] - dst) < np.abs(src[idx] - dst), prev, idx)
    ok = np.abs(src[best] - dst) <= step / 2.0 + 1e-6
    out[ok] = values[best[ok]]
    return out


def throttling(view: JobView, cfg: RuleConfig) -> Verdict:
    """Busy GPUs with their SM clock below `threshold` x the max boost clock, or power/thermal violation
    counters above `violation_share` of the time, while the job is busy.

    Only the GPUs busy in a sample are judged: with per-GPU rows, the mean clock of the GPUs whose GPU_UTIL
    is at least `busy_util_min` (`busy_clock`); without them, the cross-GPU mean clock only in samples where
    every GPU is busy (the cross-GPU minimum of GPU_UTIL at least `busy_util_min`). An idle GPU parks its
    clock (~200-400 MHz on an H100), so the mean over a job with 2 of 8 GPUs idle reads ~1,550 MHz while
    its busy GPUs run at 1,980 MHz: that is not throttling."""
    util = _get(view, "gpu_util.mean")
    clock = _get(view, "sm_clock.mean")
    power = _get(view, "power_violation.mean")
    thermal = _get(view, "thermal_violation.mean")
    if util is None or ((clock is None or view.max_clock_mhz is None) and power is None and thermal is None):
        return Verdict(
            THROTTLING, State.UNKNOWN, reason="no SM clock (with a max clock) or violation counters"
        )
    n = util.values.size
    slow = np.zeros(n, dtype=bool)
    seen = np.zeros(n, dtype=bool)
    ratio = np.full(n, np.nan)
    judged = "GPUs busy in each sample"
    pg = view.per_gpu
    per_gpu_clock = busy_clock(pg, view.busy_util_min) if pg is not None else None
    if per_gpu_clock is not None and pg is not None and view.max_clock_mhz:
        ratio = _on_grid(per_gpu_clock, np.asarray(pg.timestamps, dtype=np.float64), util.timestamps,
                         util.step) / view.max_clock_mhz  # fmt: skip
    elif clock is not None and view.max_clock_mhz and clock.values.size == n:
        low = _get(view, "gpu_util.min")
        everyone_busy = (
            np.nan_to_num(low.values) >= view.busy_util_min
            if low is not None and low.values.size == n
            else np.zeros(n, dtype=bool)
        )
        ratio = np.where(everyone_busy, clock.values / view.max_clock_mhz, np.nan)
        judged = "samples with every GPU busy (no per-GPU clocks)"
    if np.isfinite(ratio).any():
        slow |= np.nan_to_num(ratio, nan=1.0) < cfg.threshold
        seen |= np.isfinite(ratio)
    for s in (power, thermal):
        if s is not None and s.values.size == n:
            slow |= np.nan_to_num(s.values, nan=0.0) >= view.violation_share
            seen |= np.isfinite(s.values)
    busy = np.nan_to_num(util.values) > view.busy_util_min
    if per_gpu_clock is not None:
        busy |= np.isfinite(ratio)  # some GPU is busy in the sample (the clock judged is theirs)
    # A sample counts when its clock or counters were judged, or when nothing is busy (nothing to
    # throttle); a busy sample whose clock cannot be judged is unknown (neither breaks nor extends a run).
    values = np.where(np.isfinite(util.values) & (seen | ~busy), util.values, np.nan)
    line = Series(util.timestamps, values, util.step)
    state, since, last = trailing_run(line, slow & busy)
    if state is not State.FIRING or since is None or last is None:
        return Verdict(THROTTLING, state)
    during = (util.timestamps > since) & np.isfinite(ratio)
    evidence: list[tuple[str, float | str, str]] = [
        ("throttled for", _minutes(last - since), "min"),
        ("clock judged on", judged, ""),
    ]
    if during.any():
        evidence.append(("SM clock / max boost", round(float(np.mean(ratio[during])) * 100, 1), "%"))
    return Verdict(
        THROTTLING,
        _held(THROTTLING, since, last, cfg),
        title=f"Busy GPUs throttled for {_minutes(last - since):g} min",
        since=since,
        finding_code=FINDING_OF_RULE[THROTTLING],
        evidence=tuple(evidence),
    )


def xid_errors(view: JobView, cfg: RuleConfig) -> Verdict:
    """At least `threshold` GPUs with a non-zero XID code in the last `minutes` (opens at the first one,
    resolves after `minutes` without one)."""
    xid = _get(view, "xid_errors.nonzero")
    if xid is None:
        return Verdict(XID_ERRORS, State.UNKNOWN, reason="no XID series in the archive's recent window")
    hit = np.nan_to_num(xid.values, nan=0.0) >= cfg.threshold
    finite = np.isfinite(xid.values)
    if not finite.any():
        return Verdict(XID_ERRORS, State.UNKNOWN, reason="no XID samples in the recent window")
    last = float(xid.timestamps[np.flatnonzero(finite)[-1]])
    recent = hit & (xid.timestamps > last - cfg.minutes * 60.0)
    if not recent.any():
        return Verdict(XID_ERRORS, State.CLEAR)
    # The run of samples with errors ending at the latest hit: that is when they began.
    hits = np.flatnonzero(hit)
    run_start = int(hits[-1])
    while run_start > 0 and (hit[run_start - 1] or not finite[run_start - 1]):
        run_start -= 1
    since = float(xid.timestamps[run_start]) - xid.step
    gpus = float(np.nanmax(xid.values[recent]))
    return Verdict(
        XID_ERRORS,
        State.FIRING,
        title=f"XID errors on {gpus:g} GPU(s)",
        since=since,
        finding_code=FINDING_OF_RULE[XID_ERRORS],
        evidence=(("GPUs with an XID code", gpus, "GPUs"),),
    )


def _finding_rule(
    rule: str, view: JobView, cfg: RuleConfig, found: FindingView | None, title: str
) -> Verdict:
    if found is None:
        return Verdict(rule, State.CLEAR)
    # Since: the start of the finding's latest window (when the diagnosis saw it begin), else when the
    # finding was first stored; a finding whose windows all ended well before the data's end describes
    # the past, not now.
    since = found.first_seen
    data_end = view.data_until if view.data_until is not None else view.now
    if found.windows:
        latest = max(found.windows, key=lambda w: w[1])
        if latest[1] < data_end - max(cfg.minutes * 60.0, 600.0):
            return Verdict(rule, State.CLEAR, reason="the finding's latest window ended earlier")
        since = latest[0]
    since = min(since, view.now)
    evidence: tuple[tuple[str, float | str, str], ...] = (("confidence", round(found.confidence, 2), ""),)
    if found.waste_per_day_usd is not None:
        evidence += (("waste", round(found.waste_per_day_usd, 2), "USD/day"),)
    return Verdict(
        rule,
        _held(rule, since, view.now, cfg),
        title=title,
        since=since,
        finding_code=found.code,
        evidence=evidence,
    )


def straggler(view: JobView, cfg: RuleConfig) -> Verdict:
    """The diagnosis' straggler finding with at least `threshold` confidence, held for `minutes`."""
    found = _finding(view, "straggler")
    if found is not None and found.confidence < cfg.threshold:
        found = None
    return _finding_rule(STRAGGLER, view, cfg, found, found.title if found else "")


def waste(view: JobView, cfg: RuleConfig) -> Verdict:
    """A finding explaining more than `threshold` USD/day (unknown impact never fires), for `minutes`."""
    over = [
        f for f in view.findings if f.waste_per_day_usd is not None and f.waste_per_day_usd > cfg.threshold
    ]
    found = max(over, key=lambda f: f.waste_per_day_usd or 0.0) if over else None
    title = f"{found.title}: ${found.waste_per_day_usd:,.0f}/day" if found and found.waste_per_day_usd else ""
    return _finding_rule(WASTE, view, cfg, found, title)


def ingestion_stale(view: JobView, cfg: RuleConfig) -> Verdict:
    """No new data archived for `minutes` while the job runs (Prometheus down, exporter gone, selector
    matching nothing)."""
    since = view.data_until if view.data_until is not None else view.started_at
    age = view.now - since
    if age < cfg.minutes * 60.0 - 1e-6:
        return Verdict(INGESTION_STALE, State.CLEAR)
    evidence: list[tuple[str, float | str, str]] = [("no new data for", _minutes(age), "min")]
    if view.ingest_error:
        evidence.append(("last error", view.ingest_error[:200], ""))
    return Verdict(
        INGESTION_STALE,
        State.FIRING,
        title=f"No new metrics for {_minutes(age):g} min",
        since=since,
        evidence=tuple(evidence),
    )


_RULES = {
    GPUS_IDLE: gpus_idle,
    MFU_LOW: mfu_low,
    THROTTLING: throttling,
    XID_ERRORS: xid_errors,
    STRAGGLER: straggler,
    WASTE: waste,
    INGESTION_STALE: ingestion_stale,
}


def evaluate(view: JobView, configs: Mapping[str, RuleConfig]) -> dict[str, Verdict]:
    """Every configured rule's verdict for the job (rules without a config are skipped)."""
    return {rule: _RULES[rule](view, cfg) for rule, cfg in configs.items() if rule in _RULES}


def lookback_s(configs: Mapping[str, RuleConfig], step_s: float = 30.0) -> float:
    """How far back the archive must be read: the longest minimum duration plus slack for the run start."""
    longest = max((c.minutes for c in configs.values()), default=0.0)
    return max(longest * 60.0 * 2.0, 30 * 60.0) + 4 * step_s


def finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
