"""host_sync: the training step blocks the CPU on the GPU (.item(), synchronize, pageable or blocking copies).

Only a trace shows it (DCGM cannot). The trace analysis (`jobs.profiling.host_analysis`) counts every
blocking call -- cuda/hip{Stream,Device,Event}Synchronize, synchronous cudaMemcpy*, cudaMemcpyAsync to or
from pageable memory, cudaFree, aten::item/_local_scalar_dense on GPU tensors -- as a share of the step and
of the host's traced time, names the operator stacks that block, and measures the GPU idle the blocking
causes: idle while the host is blocked, plus the relaunch after a call drained the GPU's queue. The rule
fires on that GPU idle: a host that blocks while the GPU keeps working (the CPU waiting ahead of a
GPU-bound step) costs nothing. What it cannot see: Python frames (the site is the operator stack), and
other processes (a DataLoader worker's syncs are not in the training process's trace). Host levels from
node_exporter (jobs.diagnosis.host_looks), when collected, add the hosts' CPU busy and iowait over the job
as evidence: blocking syncs leave the CPUs mostly idle; they cannot place a sync in time.

Only the steady state counts: without ProfilerStep the analysis window starts at the first kernel, so
start-up blocking (lazy cudaFree/cudaMalloc of the first operator) is reported in the analysis' `phases`,
never here. A warning needs the pattern to repeat (`TT.REPEAT_*`): in several profiled steps, or -- in a
single window -- in several idle gaps with no one gap holding most of it. A one-off is at most info, and
its impact is the recurring part only.

An `nsys stats` API summary counts synchronize calls and their time, not the GPU idle they cause: it
is read (info) only when the calls are many (T.SYNC_CALLS_MIN), whatever their share of API time.

Analyses stored before those sections existed are read with the old criteria (synchronize calls per step,
CPU time in them).
"""

from __future__ import annotations

from typing import Any

from jobs.diagnosis import artifacts as A
from jobs.diagnosis import thresholds as T
from jobs.diagnosis import trace_thresholds as TT
from jobs.diagnosis.base import DiagnosisInput, Evidence, Finding, Severity, clamp01, confidence
from jobs.diagnosis.features import Features
from jobs.diagnosis.host_looks import host_look
from jobs.profiling.schema.trace import HostBlocking

CODE = "host_sync"
RECOMMENDATION = (
    "Remove host synchronisations from the step: no .item(), .cpu(), .tolist(), print(tensor) or "
    "torch.cuda.synchronize() per step (log metrics every N steps, accumulate them on the GPU), avoid "
    "data-dependent shapes (nonzero, boolean masks) on the hot path, and use non_blocking copies; "
    "torch.cuda.set_sync_debug_mode('warn') finds the calls."
)
#: Advice per kind of blocking call (host_analysis kinds), in the order they are given.
ADVICE: dict[str, str] = {
    "pageable_async_copy": (
        "Copies to or from pageable host memory block the CPU until they finish: copy into pinned "
        "buffers (tensor.pin_memory(), DataLoader pin_memory=True, or a preallocated pinned tensor with "
        ".copy_(..., non_blocking=True)) and read the result a step later."
    ),
    "item": (
        "aten::item (.item(), float(tensor), if tensor: ...) waits for the GPU each call: keep the values "
        "on the GPU and read them every N steps."
    ),
    "synchronous_copy": (
        "Synchronous copies (cudaMemcpy, .to(device) without non_blocking) wait for the GPU: use "
        "non_blocking=True with pinned host memory."
    ),
    "synchronize": (
        "Explicit synchronisations (torch.cuda.synchronize(), stream/event synchronize) drain the GPU "
        "queue: remove them from the step or move them to logging steps."
    ),
    "implicit_sync": (
        "cudaFree synchronises the device: keep PyTorch's caching allocator warm (no "
        "torch.cuda.empty_cache() in the loop, stable shapes, a fixed cudnn workspace)."
    ),
}


def check(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Fire when a trace shows the GPU idling because the host blocks on it (or, for older analyses,
    frequent synchronisations / much CPU time in them)."""
    evidence: list[Evidence] = []
    sources: list[str] = []
    windows: list[tuple[float, float]] = []
    kinds: dict[str, float] = {}
    severity = Severity.INFO
    impact = 0.0
    measured = False
    repeating = False
    for r in A.trace_ranks(inp):
        if r.attributed() and r.rank.host_blocking is not None:
            hit = _attributed(r, r.rank.host_blocking, evidence, kinds)
            if hit is None:
                continue
            measured = True
            _, warn, recurring = hit
            repeating = repeating or repetition(r)[0]
            if warn:
                severity = Severity.WARNING
            impact = max(impact, clamp01(recurring / 100.0))
        else:
            legacy = _legacy(r, evidence)
            if legacy is None:
                continue
            share, warn = legacy
            if warn:
                severity = Severity.WARNING
            impact = max(impact, share)
        windows += r.windows
        if r.source not in sources:
            sources.append(r.source)
    for art in A.nsys_stats(inp):
        api = art.nsys_stats.cuda_api
        calls, share = api.sync_calls or 0.0, api.sync_share_of_api_pct or 0.0
        # A summary has no timeline: a large share of API time in synchronize is the host waiting for GPU
        # work that runs (costs nothing, see above) as often as a GPU drained by it. Only many calls are a
        # pattern; GPUJoin's real summaries (tests/data/real/nsys-stats) spend 42-88 % of API time in 2
        # cudaDeviceSynchronize calls, one after each 0.2-2.7 s join kernel.
        if calls >= T.SYNC_CALLS_MIN:
            evidence += [
                Evidence(f"{A.source_label(art)}: sync API calls", int(calls), "count"),
                Evidence(f"{A.source_label(art)}: sync share of CUDA API time", share, "%"),
            ]
            sources.append("nsys stats")
    if not sources:
        return None
    # node_exporter's host levels over the job (jobs.diagnosis.host_looks): a host that blocks on the GPU
    # idles its CPUs (one thread waits); busy CPUs or high iowait point at the input side instead.
    hl = host_look(f)
    if hl is not None and hl.cpu_busy is not None:
        evidence += [e for e in hl.evidence() if e.label.startswith(("host CPUs", "host CPU time"))]
        cause = hl.input_cause
        if cause == "idle":
            evidence.append(Evidence("host CPUs", "mostly idle over the job: consistent with blocking syncs"))
        elif cause in ("cpu", "io"):
            evidence.append(
                Evidence(
                    "host CPUs", "busy or in iowait over the job: the input side may cost more than syncs"
                )
            )
    advice = [ADVICE[k] for k in sorted(kinds, key=lambda k: -kinds[k]) if k in ADVICE]
    recommendation = " ".join([*advice, "torch.cuda.set_sync_debug_mode('warn') finds the calls."])
    title = (
        "In the captured trace window the GPU idles because the CPU blocks on it (host synchronisations)"
        if measured and repeating
        else "In the captured trace window the CPU blocked the GPU once, not in a repeating pattern "
        "(a one-off host synchronisation)"
        if measured
        else "The CPU blocks on the GPU inside the step (host synchronisations)"
        if severity is Severity.WARNING
        else "The trace has frequent host synchronisations"
    )
    return Finding(
        code=CODE,
        severity=severity,
        confidence=confidence(0.85 if measured else 0.8 if severity is Severity.WARNING else 0.6),
        title=title,
        recommendation=recommendation if advice else RECOMMENDATION,
        evidence=evidence,
        windows=A.merge_windows(windows),
        impact=impact,
        missing_signals=[],
        sources=sources,
    )


def repetition(r: A.RankView) -> tuple[bool, float, str | None]:
    """Whether a rank's host-sync idle repeats in the steady state: (repeats?, recurring share, how), by the
    one repetition rule (`jobs.diagnosis.artifacts.repetition`) over its host-sync counts. Analyses made
    before the repetition keys existed count as repeating (their old criteria stand)."""
    idle = r.idle
    return A.repetition(
        idle.host_sync_pct or 0.0,
        idle.steps,
        idle.host_sync_steps,
        idle.host_sync_gaps,
        idle.host_sync_largest_gap_pct,
    )


def _attributed(
    r: A.RankView, blocking: HostBlocking, evidence: list[Evidence], kinds: dict[str, float]
) -> tuple[float, bool, float] | None:
    """Evidence from the host_blocking and gpu_idle_attribution sections: (GPU idle %, warning?,
    recurring GPU idle %)."""
    idle_sync = r.idle.host_sync_pct
    if idle_sync is None or idle_sync < TT.HOST_SYNC_IDLE_PCT:
        return None
    repeats, recurring, how = repetition(r)
    blocked = blocking.step_pct
    evidence += [
        Evidence(
            f"{r.label}: GPU idle caused by host blocking (captured window)", round(idle_sync, 2), "% of step"
        ),
        Evidence(
            f"{r.label}: CPU blocked on the GPU", None if blocked is None else round(blocked, 2), "% of step"
        ),
        Evidence(
            f"{r.label}: CPU blocked on the GPU",
            _round(blocking.cpu_time_pct),
            "% of CPU time",
        ),
        Evidence(f"{r.label}: GPU idle", _round(r.idle.idle_pct), "% of step"),
    ]
    if how is not None:
        evidence.append(
            Evidence(
                f"{r.label}: host-sync idle {how}"
                + ("" if repeats else " (not a repeating pattern of the steady state)"),
                round(recurring, 2),
                "% of step recurring",
            )
        )
    for row in blocking.by_kind:
        kind = str(row.kind)
        kinds[kind] = kinds.get(kind, 0.0) + (row.time_ms or 0.0)
        evidence.append(Evidence(f"{r.label}: blocking calls: {kind}", row.count, "count"))
    for site in blocking.sites[:3]:
        evidence.append(
            Evidence(f"{r.label}: blocks at {(site.site or '?')[:200]}", site.step_pct, "% of step")
        )
    return idle_sync, repeats and recurring >= TT.HOST_SYNC_IDLE_WARN_PCT, recurring


def _legacy(r: A.RankView, evidence: list[Evidence]) -> tuple[float, bool] | None:
    """Older analyses: synchronize calls per step and CPU time in them: (impact, warning?)."""
    calls = r.rank.sync.cpu_sync_calls or 0.0
    sync_ms = r.rank.sync.cpu_sync_ms or 0.0
    span = r.rank.temporal_breakdown.span_ms
    steps = r.rank.step_times.count or 0.0
    if not steps and (r.rank.step_breakdown.steps or 0.0) > 1:
        steps = r.rank.step_breakdown.steps or 0.0
    per_step = calls / steps if steps else None
    frequent = per_step >= T.SYNC_CALLS_PER_STEP if per_step is not None else calls >= T.SYNC_CALLS_MIN
    time_pct = 100.0 * sync_ms / span if span else 0.0
    if not frequent and time_pct < T.SYNC_TIME_PCT:
        return None
    names = ", ".join(str(c.name) for c in r.rank.sync.cpu_sync_by_call[:3])
    evidence += [
        Evidence(f"{r.label}: blocking sync calls{f' ({names})' if names else ''}", int(calls), "count"),
        Evidence(f"{r.label}: CPU time blocked in syncs", round(sync_ms, 3), "ms"),
        Evidence(f"{r.label}: blocked time", round(time_pct, 2), "% of traced span"),
    ]
    if per_step is not None:
        evidence.append(Evidence(f"{r.label}: sync calls per step", round(per_step, 1), "count"))
    gpu_syncs = r.rank.sync.gpu_sync_count
    if gpu_syncs:
        evidence.append(Evidence(f"{r.label}: GPU-side sync records", int(gpu_syncs), "count"))
    # The GPU idles at most while the CPU is blocked and the queue is drained.
    idle = (r.rank.temporal_breakdown.idle_pct or 0.0) / 100.0
    many = per_step is not None and per_step >= 2 * T.SYNC_CALLS_PER_STEP
    warn = time_pct >= T.SYNC_TIME_PCT or (many and idle * 100 >= T.TRACE_IDLE_MIN_PCT)
    return clamp01(min(time_pct / 100.0, idle)), warn


def _round(value: Any) -> float | None:
    return None if value is None else round(float(value), 2)
