"""Trace diff of two runs (A = "before", B = "after"): which parsed trace of each run to compare, and the
differences of their analyses (time shares, idle, step times, kernel names, host attribution), always
B − A as in HTA's TraceDiff (test − control). Pure: no Django, no ORM, no settings; the numbers come from
each trace's stored analysis (jobs.profiling.trace_analysis), read through its typed schema
(jobs.profiling.schema.trace), nothing is measured again here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Required, TypedDict, TypeVar

import msgspec

from jobs.profiling.schema.trace import (
    CommComputeOverlap,
    GpuIdleAttribution,
    HostBlocking,
    IdleBreakdown,
    KernelBreakdown,
    LaunchStats,
    StepBreakdown,
    StepTimes,
    TemporalBreakdown,
    TinyKernels,
    TraceAnalysis,
    TraceRank,
)

TRACE_KINDS = ("kineto", "nsys_sqlite")

B = TypeVar("B")


@dataclass(frozen=True)
class TraceFact:
    """A parsed trace artifact used in the diagnosis: id, kind, file name, rank, parse time, and its
    analysis decoded (jobs.profiling.schema.trace.decode_trace)."""

    id: int
    kind: str
    name: str
    rank: int | None
    parsed_at: str
    analysis: TraceAnalysis = field(default_factory=TraceAnalysis)


def pick_traces(
    a: Sequence[TraceFact], b: Sequence[TraceFact]
) -> tuple[TraceFact | None, TraceFact | None, str]:
    """The latest trace of each run of one kind both runs have (Kineto before nsys), or a reason why none.
    Each list is expected newest first."""
    for kind in TRACE_KINDS:
        ta = next((t for t in a if t.kind == kind), None)
        tb = next((t for t in b if t.kind == kind), None)
        if ta and tb:
            return ta, tb, ""
    have_a = sorted({t.kind for t in a}) or ["none"]
    have_b = sorted({t.kind for t in b}) or ["none"]
    return (
        None,
        None,
        (
            "no trace of the same kind in both runs (A: "
            + ", ".join(have_a)
            + "; B: "
            + ", ".join(have_b)
            + "): upload a Kineto trace or an nsys SQLite export of each"
        ),
    )


def pick_ranks(a: TraceAnalysis, b: TraceAnalysis) -> tuple[TraceRank | None, TraceRank | None]:
    """The same rank of both analyses when both have it, else each one's first rank with GPU kernels."""
    ra, rb = a.ranks, b.ranks
    # `has_gpu_kernels` None (an analysis older than the flag) counts as no kernels here, as it always did.
    common = [
        r.rank
        for r in ra
        if r.has_gpu_kernels is True and any(o.rank == r.rank and o.has_gpu_kernels is True for o in rb)
    ]
    if common:
        return (
            next(r for r in ra if r.rank == common[0]),
            next(r for r in rb if r.rank == common[0]),
        )

    def first(rs: list[TraceRank]) -> TraceRank | None:
        return next((r for r in rs if r.has_gpu_kernels is True), rs[0] if rs else None)

    return first(ra), first(rb)


@dataclass(frozen=True)
class Metric(Generic[B]):
    """One row of a section: its key (the stored key it reads, dotted when nested), label, unit and the
    typed read of its number from a decoded block."""

    key: str
    label: str
    unit: str
    read: Callable[[B], float | None]


class DeltaRow(TypedDict):
    """A number of both analyses and its change (B − A, rounded to 4 decimals; None when one is unknown)."""

    key: str
    label: str
    unit: str
    a: float | None
    b: float | None
    delta: float | None


class TableRow(TypedDict):
    """A class / kind of a complete breakdown in both analyses (absent from one side = 0 there)."""

    name: str
    a_count: float
    b_count: float
    diff_count: float
    a_time_ms: float
    b_time_ms: float
    diff_time_ms: float


class KernelRow(TypedDict):
    """A kernel by full name in both top lists; None where a side's top list cannot tell."""

    name: str
    short_name: str
    a_count: float | None
    b_count: float | None
    diff_count: float | None
    a_time_ms: float | None
    b_time_ms: float | None
    diff_time_ms: float | None
    change: str
    timing: str


class KernelDiff(TypedDict):
    """Kernels by name (HTA's TraceDiff categories) and how complete each side's top list is."""

    rows: list[KernelRow]
    listed_a: int
    listed_b: int
    distinct_a: float | None
    distinct_b: float | None
    complete_a: bool
    complete_b: bool
    counts: dict[str, int]


class TraceSide(TypedDict):
    """The artifact and rank a side of the diff reads; `window` as the parser wrote it."""

    artifact: int
    name: str
    rank: int | None
    window: dict[str, object]


class TraceDiff(TypedDict, total=False):
    """The trace diff: `available` false with a `reason`, or every section (see `trace_diff`)."""

    available: Required[bool]
    reason: str
    kind: str
    a: TraceSide
    b: TraceSide
    temporal: list[DeltaRow]
    idle: list[DeltaRow]
    step: list[DeltaRow]
    gpu_idle_attribution: list[DeltaRow]
    kernel_classes: list[TableRow]
    kernels: KernelDiff
    launch: list[DeltaRow]
    host_blocking: list[DeltaRow]
    host_blocking_kinds: list[TableRow]
    overlap: list[DeltaRow]
    notes: list[str]


def unavailable(reason: str) -> TraceDiff:
    """The diff when there is nothing to compare, and why."""
    return {"available": False, "reason": reason}


def _pairs(sa: B, sb: B, metrics: Sequence[Metric[B]]) -> list[DeltaRow]:
    """Rows {key, label, unit, a, b, delta} of numbers of one block of both analyses."""
    out: list[DeltaRow] = []
    for m in metrics:
        va, vb = m.read(sa), m.read(sb)
        delta = vb - va if va is not None and vb is not None else None
        out.append(
            {
                "key": m.key,
                "label": m.label,
                "unit": m.unit,
                "a": va,
                "b": vb,
                "delta": None if delta is None else round(delta, 4),
            }
        )
    return out


#: (count, time in ms) by name of a breakdown.
Counted = dict[str, tuple[float | None, float | None]]


def _table_diff(a: Counted, b: Counted) -> list[TableRow]:
    """Rows of a complete breakdown (every class / kind listed): a name absent from one side is 0 there."""
    out: list[TableRow] = []
    for name in sorted(set(a) | set(b)):
        ca, ta = a.get(name, (None, None))
        cb, tb = b.get(name, (None, None))
        ca, cb, ta, tb = ca or 0.0, cb or 0.0, ta or 0.0, tb or 0.0
        out.append(
            {
                "name": name,
                "a_count": ca,
                "b_count": cb,
                "diff_count": cb - ca,
                "a_time_ms": ta,
                "b_time_ms": tb,
                "diff_time_ms": round(tb - ta, 4),
            }
        )
    return sorted(out, key=lambda r: -abs(r["diff_time_ms"]))


def _by_class(kb: KernelBreakdown) -> Counted:
    # A later row of the same name replaces an earlier one (the parser writes each name once).
    return {r.kernel_class: (r.count, r.time_ms) for r in kb.by_class if r.kernel_class is not None}


def _by_kind(hb: HostBlocking) -> Counted:
    return {r.kind: (r.count, r.time_ms) for r in hb.by_kind if r.kind is not None}


def _top(kb: KernelBreakdown) -> Counted:
    return {k.name: (k.count, k.total_ms) for k in kb.top_kernels if k.name is not None}


def kernel_name_diff(kb_a: KernelBreakdown, kb_b: KernelBreakdown, limit: int = 20) -> KernelDiff:
    """Kernels by name as HTA's TraceDiff.compare_traces/ops_diff define them (name = the full kernel name;
    diff = B − A in count and total time): added (absent in A, present in B), removed (HTA's "deleted"),
    increased / decreased / unchanged (in both, by count), and faster / slower (in both, by total time).

    The analyses keep each trace's top kernels by time only. A name missing from a side that lists all its
    kernels is absent (0, as HTA fills); missing from a side with more kernels than listed it is not known
    ("not in A's top N"), never 0. Rows sorted by the absolute change of total time, the top `limit`."""
    top_a, top_b = _top(kb_a), _top(kb_b)
    short = {
        k.name: k.short_name or k.name for k in [*kb_a.top_kernels, *kb_b.top_kernels] if k.name is not None
    }
    distinct_a, distinct_b = kb_a.distinct_kernels, kb_b.distinct_kernels
    complete_a = distinct_a is not None and distinct_a <= len(top_a)
    complete_b = distinct_b is not None and distinct_b <= len(top_b)
    rows: list[KernelRow] = []
    for name in set(top_a) | set(top_b):
        ra, rb = top_a.get(name), top_b.get(name)
        ca, ta = ra if ra else ((0.0, 0.0) if complete_a else (None, None))
        cb, tb = rb if rb else ((0.0, 0.0) if complete_b else (None, None))
        if ra and rb:
            dc = (cb or 0.0) - (ca or 0.0)
            change = "increased" if dc > 0 else "decreased" if dc < 0 else "unchanged"
            timing = (
                "slower" if (tb or 0.0) > (ta or 0.0) else "faster" if (tb or 0.0) < (ta or 0.0) else "same"
            )
        elif rb:
            change, timing = ("added", "") if complete_a else (f"not in A's top {len(top_a)}", "")
        else:
            change, timing = ("removed", "") if complete_b else (f"not in B's top {len(top_b)}", "")
        diff_c = cb - ca if ca is not None and cb is not None else None
        diff_t = round(tb - ta, 4) if ta is not None and tb is not None else None
        rows.append(
            {
                "name": name,
                "short_name": short.get(name, name),
                "a_count": ca,
                "b_count": cb,
                "diff_count": diff_c,
                "a_time_ms": ta,
                "b_time_ms": tb,
                "diff_time_ms": diff_t,
                "change": change,
                "timing": timing,
            }
        )
    _disambiguate(rows)
    # Known changes by size first, then the rows whose change is unknown by their known side's time.
    rows.sort(
        key=lambda r: (
            r["diff_time_ms"] is None,
            -abs(r["diff_time_ms"] or 0.0),
            -((r["a_time_ms"] or 0.0) + (r["b_time_ms"] or 0.0)),
            r["name"],
        )
    )
    return {
        "rows": rows[:limit],
        "listed_a": len(top_a),
        "listed_b": len(top_b),
        "distinct_a": distinct_a,
        "distinct_b": distinct_b,
        "complete_a": complete_a,
        "complete_b": complete_b,
        "counts": {
            c: sum(1 for r in rows if r["change"] == c)
            for c in ("added", "removed", "increased", "decreased", "unchanged")
        },
    }


def _common_prefix(texts: list[str]) -> int:
    """Length of the characters all `texts` start with."""
    first, last = min(texts), max(texts)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return n


def _disambiguate(rows: list[KernelRow], width: int = 48) -> None:
    """Rows whose short names collide (one template, several instantiations: "gemv2T_kernel" three times)
    get the part of their full names that differs, so the table never shows one name on several rows."""
    groups: dict[str, list[KernelRow]] = {}
    for row in rows:
        groups.setdefault(row["short_name"], []).append(row)
    for short, group in groups.items():
        if len(group) < 2:
            continue
        names = [str(r["name"]) for r in group]
        prefix = _common_prefix(names)
        suffix = _common_prefix([n[::-1] for n in names])
        for row, name in zip(group, names, strict=True):
            middle = name[prefix : max(prefix, len(name) - suffix)].strip(" ,<>") or name
            if len(middle) > width:
                middle = middle[: width - 1] + "…"
            row["short_name"] = f"{short} ‹{middle}›"


_TEMPORAL: tuple[Metric[TemporalBreakdown], ...] = (
    Metric("idle_pct", "Idle", "%", lambda t: t.idle_pct),
    Metric("compute_pct", "Compute", "%", lambda t: t.compute_pct),
    Metric("non_compute_pct", "Non-compute", "%", lambda t: t.non_compute_pct),
    Metric("idle_ms", "Idle", "ms", lambda t: t.idle_ms),
    Metric("compute_ms", "Compute", "ms", lambda t: t.compute_ms),
    Metric("non_compute_ms", "Non-compute", "ms", lambda t: t.non_compute_ms),
    Metric("span_ms", "Analysed span", "ms", lambda t: t.span_ms),
)
_IDLE: tuple[Metric[IdleBreakdown], ...] = (
    Metric("host_wait_pct", "Host wait", "% of idle", lambda i: i.host_wait_pct),
    Metric("kernel_wait_pct", "Kernel wait", "% of idle", lambda i: i.kernel_wait_pct),
    Metric("other_pct", "Other", "% of idle", lambda i: i.other_pct),
    Metric("host_wait_ms", "Host wait", "ms", lambda i: i.host_wait_ms),
    Metric("kernel_wait_ms", "Kernel wait", "ms", lambda i: i.kernel_wait_ms),
    Metric("other_ms", "Other", "ms", lambda i: i.other_ms),
    Metric("idle_ms", "Idle (all streams)", "ms", lambda i: i.idle_ms),
)
_STEP_TIMES: tuple[Metric[StepTimes], ...] = (
    Metric("median_ms", "Step (median)", "ms", lambda s: s.median_ms),
    Metric("count", "Steps", "steps", lambda s: s.count),
)
_STEP: tuple[Metric[StepBreakdown], ...] = (
    Metric("step_ms_mean", "Step (mean)", "ms", lambda s: s.step_ms_mean),
    Metric("dataloader_pct", "Input (DataLoader)", "% of step", lambda s: s.dataloader_pct),
    Metric("kernel_pct", "Compute kernels", "% of step", lambda s: s.kernel_pct),
    Metric("communication_pct", "Communication", "% of step", lambda s: s.communication_pct),
    Metric("memcpy_pct", "Memcpy", "% of step", lambda s: s.memcpy_pct),
    Metric("memset_pct", "Memset", "% of step", lambda s: s.memset_pct),
    Metric("runtime_pct", "CUDA runtime", "% of step", lambda s: s.runtime_pct),
    Metric("cpu_exec_pct", "CPU execution", "% of step", lambda s: s.cpu_exec_pct),
    Metric("other_pct", "Other", "% of step", lambda s: s.other_pct),
)
_ATTRIBUTION: tuple[Metric[GpuIdleAttribution], ...] = (
    Metric("idle_pct", "GPU idle", "% of window", lambda g: g.idle_pct),
    Metric("input_pct", "… waiting for input", "% of window", lambda g: g.input_pct),
    Metric("host_sync_pct", "… host blocking", "% of window", lambda g: g.host_sync_pct),
    Metric("launch_gaps_pct", "… launch gaps", "% of window", lambda g: g.launch_gaps_pct),
    Metric("other_pct", "… other", "% of window", lambda g: g.other_pct),
)
_HOST: tuple[Metric[HostBlocking], ...] = (
    Metric("calls", "Blocking calls", "calls", lambda h: h.calls),
    Metric("blocked_ms", "Blocked", "ms", lambda h: h.blocked_ms),
    Metric("step_pct", "Blocked", "% of step", lambda h: h.step_pct),
)
_KERNELS: tuple[Metric[KernelBreakdown], ...] = (
    Metric("kernel_count", "Kernels", "kernels", lambda k: k.kernel_count),
    Metric("kernel_time_ms", "Kernel time", "ms", lambda k: k.kernel_time_ms),
    Metric("distinct_kernels", "Distinct kernels", "names", lambda k: k.distinct_kernels),
)
_LAUNCH: tuple[Metric[LaunchStats], ...] = (
    Metric("launches", "Launches", "calls", lambda la: la.launches),
    Metric(
        "gpu_shorter_than_launch_pct",
        "GPU time shorter than its launch",
        "% of launches",
        lambda la: la.gpu_shorter_than_launch_pct,
    ),
    Metric(
        "launch_delay_outliers_count",
        "Launch delays over the cutoff",
        "launches",
        lambda la: la.launch_delay_outliers_count,
    ),
    Metric("launch_delay.p50_us", "Launch delay p50", "µs", lambda la: la.launch_delay.p50_us),
    Metric("launch_delay.p90_us", "Launch delay p90", "µs", lambda la: la.launch_delay.p90_us),
    Metric(
        "cpu_launch_duration.p50_us", "CPU launch call p50", "µs", lambda la: la.cpu_launch_duration.p50_us
    ),
    Metric("gpu_duration.p50_us", "GPU op duration p50", "µs", lambda la: la.gpu_duration.p50_us),
)
_TINY: tuple[Metric[TinyKernels], ...] = (
    Metric("count", "Tiny kernels (< 10 µs)", "kernels", lambda t: t.count),
    Metric("count_pct", "Tiny kernels", "% of kernels", lambda t: t.count_pct),
    Metric("time_pct", "Tiny kernels' time", "% of kernel time", lambda t: t.time_pct),
)
_OVERLAP: tuple[Metric[CommComputeOverlap], ...] = (
    Metric(
        "overlap_pct", "Communication overlapped by compute", "% of communication", lambda o: o.overlap_pct
    ),
)


def _side(fact: TraceFact, rank: TraceRank) -> TraceSide:
    # The window goes out as the parser wrote it (Window omits what an older analysis lacks).
    return {
        "artifact": fact.id,
        "name": fact.name,
        "rank": rank.rank,
        "window": msgspec.to_builtins(rank.window),
    }


def trace_diff(ta: TraceFact, tb: TraceFact) -> TraceDiff:
    """Deltas (B − A) of two trace analyses (jobs.profiling.trace_analysis.analyze_trace), on one rank each:
    temporal and idle breakdowns (HTA), step breakdown, GPU idle by host activity, kernel time by category
    and by name, kernel count and launch statistics, host blocking. Units in each row; % deltas in points."""
    ra, rb = pick_ranks(ta.analysis, tb.analysis)
    if ra is None or rb is None:
        return unavailable("a trace analysis has no rank with GPU work")
    kba, kbb = ra.kernel_breakdown, rb.kernel_breakdown
    launch = _pairs(kba, kbb, _KERNELS)
    launch += _pairs(ra.launch_stats, rb.launch_stats, _LAUNCH)
    launch += _pairs(kba.tiny_kernels, kbb.tiny_kernels, _TINY)
    # An absent host_blocking block (the blocking-call analysis did not run) reads as all unknown.
    ha, hb = ra.host_blocking or HostBlocking(), rb.host_blocking or HostBlocking()
    step = _pairs(ra.step_times, rb.step_times, _STEP_TIMES)
    step += _pairs(ra.step_breakdown, rb.step_breakdown, _STEP)
    return {
        "available": True,
        "kind": ta.kind,
        "a": _side(ta, ra),
        "b": _side(tb, rb),
        "temporal": _pairs(ra.temporal_breakdown, rb.temporal_breakdown, _TEMPORAL),
        "idle": _pairs(ra.idle_breakdown, rb.idle_breakdown, _IDLE),
        "step": step,
        "gpu_idle_attribution": _pairs(ra.gpu_idle_attribution, rb.gpu_idle_attribution, _ATTRIBUTION),
        "kernel_classes": _table_diff(_by_class(kba), _by_class(kbb)),
        "kernels": kernel_name_diff(kba, kbb),
        "launch": launch,
        "host_blocking": _pairs(ha, hb, _HOST),
        "host_blocking_kinds": _table_diff(_by_kind(ha), _by_kind(hb)),
        "overlap": _pairs(ra.comm_compute_overlap, rb.comm_compute_overlap, _OVERLAP),
        "notes": _window_notes(ra, rb),
    }


def _window_notes(ra: TraceRank, rb: TraceRank) -> list[str]:
    notes = [
        "forward, backward and optimizer are not told apart by the trace analysis: the step is split "
        "into input, kernels, communication, copies, runtime and CPU time"
    ]
    steps_a, steps_b = ra.window.profiler_steps, rb.window.profiler_steps
    if steps_a != steps_b:
        notes.append(
            f"the traces cover different numbers of profiler steps ({steps_a} vs "
            f"{steps_b}): compare shares and per-step times, not totals"
        )
    return notes
