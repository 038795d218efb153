"""memory_bound: device memory is the bottleneck: DRAM interface busy, tensor pipes waiting for data.

DCGM: DRAM_ACTIVE near its practical maximum (~0.8) with tensor activity low. Nsight Compute confirms it
per kernel: memory throughput (SOL "Memory Throughput", or DRAM/L1/L2 throughput when that is not
collected) at least 60 % of peak and 10 points above SM throughput, or ncu's own SOLBottleneck verdict
"Memory is more heavily utilized than Compute"; the share of profiled kernel time in such kernels.

What ncu cannot tell: the kernels it did not profile (its filters sample launches), and how much of the
job's GPU time the profiled kernels take (kernel time only, no timeline).

Resolution: a level check over the job, valid in both regimes; memory-bound phases shorter than the
DCGM collect interval are averaged with compute phases, so a step that is memory-bound only part of the
time reads below the threshold (ncu sees it per kernel).
"""

from __future__ import annotations

from jobs.diagnosis import artifacts as A
from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import DiagnosisInput, Evidence, Finding, Severity, clamp01, confidence
from jobs.diagnosis.features import Features
from jobs.diagnosis.rules.common import busy_share, pct, ratio_ev

CODE = "memory_bound"
RECOMMENDATION = (
    "The kernels wait on device memory, not on math. Fuse memory-bound chains of element-wise ops "
    "(torch.compile, fused LayerNorm/RMSNorm, fused optimizers), use FlashAttention instead of "
    "materialised attention, and raise the batch or sequence length per GPU so matmuls have more "
    "arithmetic per byte."
)


def check(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Fire on high DRAM activity with low tensor activity, or on a memory-bound ncu profile."""
    dram, tensor = f.level("dram_active"), f.level("tensor_active")
    evidence: list[Evidence] = []
    sources: list[str] = []
    missing: list[str] = []
    base, impact = 0.0, 0.0
    if dram is not None and dram >= T.DRAM_HIGH and (tensor is None or tensor < T.TENSOR_ACTIVE_LOW):
        base = 0.85 if tensor is not None else 0.6
        missing += f.missing(["tensor_active"])
        sm = f.level("sm_active")
        evidence += [
            ratio_ev("DRAM active while busy, median", dram),
            ratio_ev("tensor active while busy, median", tensor),
            ratio_ev("SM active while busy, median", sm),
        ]
        impact = busy_share(f) * clamp01(1.0 - (tensor or 0.0) / T.TENSOR_ACTIVE_HEALTHY)
        sources.append("metrics")
    for art in A.ncu(inp):
        ncu = art.ncu
        ours = ncu.bound_time_share_pct.get("memory")
        theirs = ncu.ncu_verdict_time_share_pct.get("memory")
        share = max((v for v in (ours, theirs) if v is not None), default=None)
        if share is not None and share >= T.NCU_MEMORY_BOUND_PCT:
            label = A.source_label(art)
            evidence += [
                Evidence(f"{label}: kernel time in memory-bound kernels (throughputs)", ours, "%"),
                Evidence(f"{label}: kernel time ncu's SOL rule calls memory-bound", theirs, "%"),
                Evidence(
                    f"{label}: memory throughput, duration-weighted",
                    ncu.duration_weighted_memory_throughput_pct,
                    "% of peak",
                ),
                Evidence(
                    f"{label}: SM throughput, duration-weighted",
                    ncu.duration_weighted_sm_throughput_pct,
                    "% of peak",
                ),
            ]
            base = max(base, 0.6) + (0.1 if sources else 0.0)
            sources.append("ncu")
    if not sources:
        return None
    title = (
        f"Memory-bound: DRAM active {pct(dram)} while tensor cores are active {pct(tensor)}"
        if "metrics" in sources
        else "Memory-bound kernels dominate the profiled kernel time"
    )
    return Finding(
        code=CODE,
        severity=Severity.WARNING,
        confidence=confidence(
            min(base, 0.95),
            missing=missing,
            coverage=f.coverage("dram_active") if "metrics" in sources else 1.0,
        ),
        title=title,
        recommendation=RECOMMENDATION,
        evidence=evidence,
        windows=f.whole_window if "metrics" in sources else [],
        impact=impact,
        missing_signals=missing,
        sources=sources,
    )
