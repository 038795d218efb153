"""host_sync: the training step blocks the CPU on the GPU (.item(), cudaStreamSynchronize, ...).

Only a trace shows it (DCGM cannot): CPU-side synchronisation calls per step and the time the CPU spent
blocked in them. Each sync drains the GPU queue, so the next kernels launch late and the GPU idles.
"""

from __future__ import annotations

from jobs.diagnosis import artifacts as A
from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import DiagnosisInput, Evidence, Finding, Severity, clamp01, confidence
from jobs.diagnosis.features import Features

CODE = "host_sync"
RECOMMENDATION = (
    "Remove host synchronisations from the step: no .item(), .cpu(), .tolist(), print(tensor) or "
    "torch.cuda.synchronize() per step (log metrics every N steps, accumulate them on the GPU), avoid "
    "data-dependent shapes (nonzero, boolean masks) on the hot path, and use non_blocking copies; "
    "torch.cuda.set_sync_debug_mode('warn') finds the calls."
)


def check(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Fire when a trace shows frequent blocking synchronisations or much CPU time blocked in them."""
    evidence: list[Evidence] = []
    sources: list[str] = []
    severity = Severity.INFO
    impact = 0.0
    for r in A.trace_ranks(inp):
        calls = r.n("sync", "cpu_sync_calls") or 0.0
        sync_ms = r.n("sync", "cpu_sync_ms") or 0.0
        span = r.n("temporal_breakdown", "span_ms")
        steps = r.n("step_times", "count") or 0.0
        if not steps and (r.n("step_breakdown", "steps") or 0.0) > 1:
            steps = r.n("step_breakdown", "steps") or 0.0
        per_step = calls / steps if steps else None
        frequent = per_step >= T.SYNC_CALLS_PER_STEP if per_step is not None else calls >= T.SYNC_CALLS_MIN
        time_pct = 100.0 * sync_ms / span if span else 0.0
        if not frequent and time_pct < T.SYNC_TIME_PCT:
            continue
        names = ", ".join(str(c.get("name")) for c in A.items(r.data, "sync", "cpu_sync_by_call")[:3])
        evidence += [
            Evidence(f"{r.label}: blocking sync calls{f' ({names})' if names else ''}", int(calls), "count"),
            Evidence(f"{r.label}: CPU time blocked in syncs", round(sync_ms, 3), "ms"),
            Evidence(f"{r.label}: blocked time", round(time_pct, 2), "% of traced span"),
        ]
        if per_step is not None:
            evidence.append(Evidence(f"{r.label}: sync calls per step", round(per_step, 1), "count"))
        gpu_syncs = r.n("sync", "gpu_sync_count")
        if gpu_syncs:
            evidence.append(Evidence(f"{r.label}: GPU-side sync records", int(gpu_syncs), "count"))
        # The GPU idles at most while the CPU is blocked and the queue is drained.
        idle = (r.n("temporal_breakdown", "idle_pct") or 0.0) / 100.0
        many = per_step is not None and per_step >= 2 * T.SYNC_CALLS_PER_STEP
        if time_pct >= T.SYNC_TIME_PCT or (many and idle * 100 >= T.TRACE_IDLE_MIN_PCT):
            severity = Severity.WARNING
        impact = max(impact, clamp01(min(time_pct / 100.0, idle)))
        if r.source not in sources:
            sources.append(r.source)
    for art in A.nsys_stats(inp):
        calls = A.getnum(art.analysis, "cuda_api", "sync_calls") or 0.0
        share = A.getnum(art.analysis, "cuda_api", "sync_share_of_api_pct") or 0.0
        if calls >= T.SYNC_CALLS_MIN or share >= 2 * T.SYNC_TIME_PCT:
            evidence += [
                Evidence(f"{A.source_label(art)}: sync API calls", int(calls), "count"),
                Evidence(f"{A.source_label(art)}: sync share of CUDA API time", share, "%"),
            ]
            sources.append("nsys stats")
    if not sources:
        return None
    return Finding(
        code=CODE,
        severity=severity,
        confidence=confidence(0.8 if severity is Severity.WARNING else 0.6),
        title=(
            "The CPU blocks on the GPU inside the step (host synchronisations)"
            if severity is Severity.WARNING
            else "The trace has frequent host synchronisations"
        ),
        recommendation=RECOMMENDATION,
        evidence=evidence,
        windows=[],
        impact=impact,
        missing_signals=[],
        sources=sources,
    )
