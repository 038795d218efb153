"""launch_overhead: the GPU always has a kernel running, but the kernels are tiny and the SMs mostly empty.

Metrics: busy GPU_UTIL with very low SM active and every pipe quiet (tensor and DRAM) — a level check that
holds at any resolution. Unresolved regime (steps far shorter than the 15-60 s samples): utilisation below
100 % whose GPU_UTIL point samples (NVML's 1/6-1 s window) all read about the same — the idle time comes in
gaps far shorter than a window, between kernels — with SM active (or tensor active) per unit of busy time
well below a GEMM-dominated step's and idle links: the host cannot launch kernels fast enough (seed:
"dense, very short kernels"), at a lower confidence, naming the nsys capture that confirms it. Cannot
see: kernel durations, launch gaps or host syncs (which look the same at this resolution).

What a sample is (jobs.diagnosis.regimes): GPU_UTIL is NVML's share of a 1/6-1 s window with a kernel
resident, the profiling fields collect-interval averages. Tiny kernels with microsecond launch gaps keep a
kernel resident most of every window (the seed's run 2: 68 %; launch-bound jobs in the field ~95 % with low
SM activity) and every window reads the same; a mean at or below 50 % is a GPU without work most of the
time (a host/input wait), whatever the spread, and is not read as launch-bound. On a serving job
(kind inference) partial utilisation is load, so the unresolved look is not applied; with the kind
unknown it is info.

A trace confirms it: most kernels shorter than 10 us, the GPU waiting between kernels for the next launch,
kernels shorter than their own CPU launch call (HTA's launch statistics). The trace's kernel-wait share is
measured on the union of the rank's streams (an instant is idle when no stream runs). An `nsys stats`
kernel summary has kernel durations and launch counts but no timeline: it shows tiny kernels, not the
gaps between them, so from a summary alone the finding stays info, and a summary of fewer than
MIN_TRACE_KERNELS launches is not read at all.

Only gaps under the launch-gap limit (1 ms) are this rule's: per-launch cost, fixed by CUDA graphs and
fusion. Longer gaps that end with a late launch while the launching thread runs CPU operators (the
issue #24 trace: 63 ms of aten::copy_ between GEMMs) are the host doing other CPU work, not launching:
data_pipeline_stall's host-work reading. Cannot see from a trace: Python time between operators (not
traced): a launch gap the host spent in Python outside any operator reads as the host not busy.
"""

from __future__ import annotations

from jobs.diagnosis import artifacts as A
from jobs.diagnosis import kinds as K
from jobs.diagnosis import regimes as R
from jobs.diagnosis import thresholds as T
from jobs.diagnosis import trace_thresholds as TT
from jobs.diagnosis.base import DiagnosisInput, Evidence, Finding, Severity, clamp01, confidence
from jobs.diagnosis.features import Features
from jobs.diagnosis.rules.common import busy_share, pct, ratio_ev, saturated, util_ev, util_level

CODE = "launch_overhead"
RECOMMENDATION = (
    "Thousands of tiny kernels keep the GPU 'busy' while each uses a few SMs for a few microseconds. Capture "
    "the step in a CUDA graph (torch.compile mode='reduce-overhead'), fuse element-wise ops (torch.compile, "
    "fused optimizers and norms), and raise the per-GPU batch so each kernel does more work."
)


def check(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Fire from quiet-but-busy metrics or from a trace dominated by tiny, launch-bound kernels."""
    evidence: list[Evidence] = []
    sources: list[str] = []
    impacts: list[float] = []
    missing: list[str] = []
    base = 0.0
    windows: list[tuple[float, float]] = []
    util, sm = util_level(f), f.level("sm_active")
    tensor, dram = f.level("tensor_active"), f.level("dram_active")
    quiet = (
        tensor is not None
        and dram is not None
        and tensor < T.LAUNCH_TENSOR_MAX
        and dram < T.LAUNCH_DRAM_MAX
        and saturated(f)
    )
    if quiet and (sm is None or sm < T.LAUNCH_SM_ACTIVE_MAX):
        base = 0.8 if sm is not None else 0.55
        missing += f.missing(["sm_active"])
        evidence += [
            util_ev(f, util),
            ratio_ev("SM active while busy, median", sm),
            ratio_ev("tensor active while busy, median", tensor),
            ratio_ev("DRAM active while busy, median", dram),
        ]
        # Without SM active, healthy jobs keep tensor active near half of SM active: scale it up.
        level = sm if sm is not None else 2.0 * (tensor or 0.0)
        impacts.append(busy_share(f) * clamp01(1.0 - level / T.SM_ACTIVE_HEALTHY))
        sources.append("metrics")
        windows = f.whole_window
    unresolved = False
    lk = f.looks
    # A server's partial utilisation is its load (jobs.diagnosis.kinds), not launch gaps of a step loop.
    serving = K.is_serving(inp.kind)
    if not sources and not serving and lk is not None and lk.util_mean is not None and R.launch_bound(lk):
        unresolved = True
        base = T.UNRESOLVED_CONFIDENCE
        evidence += lk.evidence() + f.resolution.evidence("unresolved")
        missing += f.missing(["sm_active"])
        per_busy = lk.per_busy(lk.sm) if lk.sm is not None else 2.0 * (lk.per_busy(lk.tensor) or 0.0)
        # Idle between kernels plus the emptiness of the kernels themselves.
        impacts.append(clamp01(1.0 - lk.util_mean * min((per_busy or 0.0) / T.SM_ACTIVE_HEALTHY, 1.0)))
        sources.append("metrics")
        windows = f.whole_window
    trace_windows: list[tuple[float, float]] = []
    trace_hits = _trace(inp, evidence, impacts, sources, trace_windows)
    if trace_hits and "metrics" not in sources:
        windows = A.merge_windows(trace_windows)  # trace findings cover the captured window
    stats_hits = _nsys_stats(inp, evidence, sources)
    if not sources:
        return None
    if trace_hits or stats_hits:
        base = max(base, 0.75) + (0.1 if base else 0.0)
    # Tiny kernels alone (nsys stats without a timeline) do not show that the GPU waited: info only.
    severity = Severity.WARNING if ("metrics" in sources or trace_hits) else Severity.INFO
    if sm is not None and sm < T.SM_ACTIVE_VERY_LOW and "metrics" in sources and not unresolved:
        severity = Severity.CRITICAL
    if unresolved and not trace_hits and f.samples_per_gpu < T.MIN_SAMPLES_TO_WARN:
        severity = Severity.INFO
    title = (
        f"Launch-bound: GPU_UTIL {pct(lk.util_mean)} with the idle time spread between small kernels "
        f"(steps are shorter than the {f.resolution.sample_interval_s:g} s sampling)"
        if unresolved and lk is not None and not trace_hits and not stats_hits
        else f"Launch-bound: the GPU reads {pct(util)} busy but its SMs are active {pct(sm)} of the time"
        if "metrics" in sources and sm is not None
        else "Launch-bound: in the captured trace window, short launch gaps and tiny kernels idle the GPU"
        if trace_hits or stats_hits
        else f"Launch-bound: the GPU reads {pct(util)} busy while tensor and DRAM pipes are nearly idle"
    )
    finding = Finding(
        code=CODE,
        severity=severity,
        confidence=confidence(
            min(base, 0.95),
            missing=missing,
            coverage=f.coverage("tensor_active") if "metrics" in sources else 1.0,
        ),
        title=title,
        recommendation=RECOMMENDATION + (R.capture("launch") if unresolved and len(sources) == 1 else ""),
        evidence=evidence,
        windows=windows,
        impact=max(impacts, default=0.0),
        missing_signals=missing,
        sources=sources,
    )
    # Only the unresolved look reads partial utilisation as launch gaps; the busy-but-quiet level check
    # reads the same on any job.
    return K.gate_unknown(finding, inp.kind) if unresolved else finding


def _trace(
    inp: DiagnosisInput,
    evidence: list[Evidence],
    impacts: list[float],
    sources: list[str],
    windows: list[tuple[float, float]] | None = None,
) -> bool:
    """Trace evidence of launch overhead; appends the capture windows of the ranks that show it.

    With the analysis' GPU idle attribution (`jobs.profiling.host_analysis`): idle time in gaps shorter
    than ~1 ms that neither the DataLoader nor a blocking call explains, while the host is busy launching
    (traced ops cover the gaps) or the kernels are tiny / shorter than their launch calls. Its share of
    the step is the impact. Older analyses: most kernels tiny with kernel-to-kernel waits (HTA).
    """
    hit = False
    for r in A.trace_ranks(inp):
        tiny = r.rank.kernel_breakdown.tiny_kernels.count_pct
        shorter = r.rank.launch_stats.gpu_shorter_than_launch_pct
        kernels, steps = r.rank.kernel_breakdown.kernel_count, r.rank.step_times.count
        if r.attributed():
            launch = r.idle.launch_gaps_pct
            busy = r.idle.launch_gaps_host_busy_pct
            if launch is None or launch < TT.LAUNCH_GAPS_PCT:
                continue
            launching = (
                (busy or 0.0) >= TT.LAUNCH_HOST_BUSY_PCT
                or (tiny or 0.0) >= TT.TINY_KERNEL_PCT
                or (shorter or 0.0) >= TT.SHORTER_THAN_LAUNCH_PCT
            )
            if not launching:
                continue
            gaps = {(g.lower_us, g.upper_us): g.count for g in r.idle.idle_gaps}
            evidence += [
                Evidence(f"{r.label}: GPU idle in launch gaps < 1 ms (captured window)", launch, "% of step"),
                Evidence(f"{r.label}: idle gaps of 30 µs – 1 ms", gaps.get((30.0, 1000.0)), "count"),
                Evidence(f"{r.label}: host busy during those gaps", busy, "%"),
                Evidence(f"{r.label}: GPU idle", r.idle.idle_pct, "% of step"),
                Evidence(f"{r.label}: kernels shorter than 10 µs", tiny, "% of kernels"),
                Evidence(f"{r.label}: kernels shorter than their launch call", shorter, "%"),
            ]
            impacts.append(clamp01(launch / 100.0))
        else:
            kernel_wait = r.rank.idle_breakdown.kernel_wait_pct
            idle = r.rank.temporal_breakdown.idle_pct
            if tiny is None or tiny < T.TINY_KERNEL_COUNT_PCT or idle is None or idle < T.TRACE_IDLE_MIN_PCT:
                continue
            waiting = (kernel_wait or 0.0) >= T.KERNEL_WAIT_SHARE_PCT or (shorter or 0.0) >= (
                T.GPU_SHORTER_THAN_LAUNCH_PCT
            )
            if not waiting:
                continue
            evidence += [
                Evidence(f"{r.label}: kernels shorter than 10 µs", tiny, "% of kernels"),
                Evidence(f"{r.label}: GPU idle", idle, "% of span"),
                Evidence(f"{r.label}: kernels shorter than their launch call", shorter, "%"),
            ]
            impacts.append(clamp01(idle / 100.0 * max(kernel_wait or 0.0, shorter or 0.0) / 100.0))
        hit = True
        if kernels and steps:
            evidence.append(Evidence(f"{r.label}: kernels per step", round(kernels / steps), "count"))
        if windows is not None:
            windows += r.windows
        if r.source not in sources:
            sources.append(r.source)
    return hit


def _nsys_stats(inp: DiagnosisInput, evidence: list[Evidence], sources: list[str]) -> bool:
    hit = False
    for art in A.nsys_stats(inp):
        kernels = art.nsys_stats.kernels
        tiny = kernels.tiny_instance_share_pct
        # A summary of a handful of launches says nothing about a launch rate (the trace's floor,
        # TT.MIN_TRACE_KERNELS): GPUJoin's real summaries (tests/data/real/nsys-stats) hold 6 launches, 3 of
        # them cub scans under 10 us beside two 0.2-0.6 s join kernels -- half "tiny", not launch-bound.
        if (kernels.instances or 0) < TT.MIN_TRACE_KERNELS:
            continue
        if tiny is not None and tiny >= T.TINY_KERNEL_COUNT_PCT:
            hit = True
            evidence.append(
                Evidence(f"{A.source_label(art)}: kernels shorter than 10 µs", tiny, "% of kernels")
            )
            if "nsys stats" not in sources:
                sources.append("nsys stats")
    return hit
