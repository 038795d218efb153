"""tensor_cores_idle: a bf16/fp16 (tensor-core dtype) job whose SMs are busy but not on tensor cores.

Seed: a job that claims bf16 with PIPE_TENSOR_ACTIVE below 30 % wastes its compute. Memory-bound work also
leaves the tensor pipes idle; that has its own rule, so high DRAM activity keeps this one quiet.

Sources: DCGM (tensor vs SM activity), a trace's kernels, and the summary formats -- an `nsys stats`
kernel summary or an Nsight Compute CSV -- whose `tensor_cores` block classifies the same kernel names
with the same classifier (`jobs.profiling.kernel_classes`: tensor-op vs SIMT; cuBLAS gemv is SIMT).

Samples (metrics): PIPE_TENSOR_ACTIVE and SM_ACTIVE are DCGM collect-interval averages (30 s by default)
of the cycles the tensor pipes / SMs are busy, so at any 5-60 s scrape they are levels over many steps:
tensor per unit of SM activity is what reads, valid in both regimes; the NVML window does not enter. An
exposed collective also leaves the tensor pipes idle; with collective-sized link traffic that is
communication_wait's reading.

What it cannot see: from kernel names, whether a SIMT matmul *could* be tensor-core shaped (the job's
dtype says it should); from a summary, the share of wall time the kernels take (no timeline: the
impact is a share of summed kernel time, an upper bound of the GPU time it costs); from ncu, the
kernels it did not profile (ncu samples the launches its filters select).
"""

from __future__ import annotations

from jobs.diagnosis import artifacts as A
from jobs.diagnosis import regimes as R
from jobs.diagnosis import thresholds as T
from jobs.diagnosis import trace_thresholds as TT
from jobs.diagnosis.base import (
    ArtifactAnalysis,
    DiagnosisInput,
    Evidence,
    Finding,
    Severity,
    clamp01,
    confidence,
)
from jobs.diagnosis.features import Features
from jobs.diagnosis.rules.common import busy_share, pct, ratio_ev, saturated
from jobs.evaluation.catalog import TENSOR_CORE_DTYPES, normalise_dtype

CODE = "tensor_cores_idle"
RECOMMENDATION = (
    "The math is not running on the tensor cores. Check that autocast/AMP is really on for the forward "
    "pass (torch.autocast(dtype=torch.bfloat16)) and that the model is not silently in fp32; pad matmul "
    "dimensions (hidden, heads x head_dim, vocab, batch x sequence) to multiples of 8 (16 bytes) or 64; "
    "use fused attention (flash/SDPA) kernels."
)


def check(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Fire when SMs work but tensor activity stays low (metrics), or tensor-core kernels are rare (trace)."""
    dtype = normalise_dtype(inp.dtype) or str(inp.dtype)
    if dtype not in TENSOR_CORE_DTYPES:
        return None
    sm, tensor = f.level("sm_active"), f.level("tensor_active")
    dram, fp32 = f.level("dram_active"), f.level("fp32_active")
    evidence: list[Evidence] = []
    sources: list[str] = []
    missing: list[str] = []
    severity = Severity.INFO
    base, impact = 0.0, 0.0
    not_memory = dram is None or dram < T.DRAM_HIGH
    if tensor is not None and not_memory:
        if sm is not None:
            ratio = tensor / sm if sm > 0 else 0.0
            if sm >= T.SM_BUSY_MIN and tensor < T.TENSOR_ACTIVE_LOW and ratio < T.TENSOR_PER_SM_MAX:
                base = 0.85
                severity = Severity.WARNING if tensor < T.TENSOR_ACTIVE_VERY_LOW else Severity.INFO
                evidence.append(ratio_ev("SM active while busy, median", sm))
        else:
            working = (dram is not None and dram >= T.PROXY_DRAM_WORKING) or (
                fp32 is not None and fp32 >= T.FP32_BUSY
            )
            # Without SM_ACTIVE a busy GPU with idle tensor pipes may be waiting in a spinning collective
            # (NCCL keeps a kernel resident): with collective-sized link traffic that is the reading
            # (communication_wait), not kernels that miss the tensor cores.
            lk = f.looks
            in_collective = lk is not None and R.collective(lk)
            if saturated(f) and tensor < T.TENSOR_ACTIVE_VERY_LOW and working and not in_collective:
                base, severity = 0.6, Severity.WARNING
                missing.append("sm_active")
        if base:
            sources.append("metrics")
            evidence += [ratio_ev("tensor active while busy, median", tensor), ratio_ev("DRAM active", dram)]
            if fp32 is not None:
                evidence.append(ratio_ev("FP32 pipe active while busy, median", fp32))
                if fp32 >= T.FP32_BUSY:
                    base += 0.1
            else:
                missing += f.missing(["fp32_active"])
            impact = busy_share(f) * clamp01(1.0 - tensor / T.TENSOR_ACTIVE_HEALTHY)
    windows: list[tuple[float, float]] = []
    for r in A.trace_ranks(inp):
        hit = _trace(r, evidence)
        if hit is None:
            continue
        if r.source not in sources:
            sources.append(r.source)
        windows += r.windows
        base = max(base, 0.5 if hit < 0.05 else 0.65)
        impact = max(impact, hit)
    for art in [*A.nsys_stats(inp), *A.ncu(inp)]:
        hit = _summary(art, evidence)
        if hit is None:
            continue
        label = "nsys stats" if art.nsys_stats.format == "nsys_stats_csv" else "ncu"
        if label not in sources:
            sources.append(label)
        base = max(base, 0.6)
        impact = max(impact, hit)
    if not sources:
        return None
    if "metrics" in sources and len(sources) > 1:
        base += 0.05
    title = (
        f"A {dtype} job with tensor cores active only {pct(tensor)} of the time"
        f"{f' while SMs are {pct(sm)} active' if sm is not None else ''}"
        if "metrics" in sources
        else f"A {dtype} job whose compute kernels in the captured trace window rarely use tensor cores"
        if windows
        else f"A {dtype} job whose profiled compute kernels rarely use tensor cores"
    )
    return Finding(
        code=CODE,
        severity=severity,
        confidence=confidence(
            min(base, 0.95),
            missing=[m for m in missing if m != "sm_active"],
            coverage=f.coverage("tensor_active") if "metrics" in sources else 1.0,
        ),
        title=title,
        recommendation=RECOMMENDATION,
        evidence=[Evidence("job dtype", dtype), *evidence],
        windows=f.whole_window if "metrics" in sources else A.merge_windows(windows),
        impact=impact,
        missing_signals=missing,
        sources=sources,
    )


def _trace(r: A.RankView, evidence: list[Evidence]) -> float | None:
    """The impact a trace rank shows, or None: compute kernels off the tensor cores.

    Kernel names say which math units a kernel uses (`jobs.profiling.kernel_classes`): SIMT GEMMs and
    convolutions (sgemm, FFMA xmma, scudnn) are matmuls that ran on CUDA cores. A trace cannot see
    whether the model's matmuls *could* be tensor-core shaped; the dtype the job declares says they should.
    """
    cores = r.rank.tensor_cores
    share, simt = cores.tensor_core_compute_time_pct, cores.simt_compute_time_pct
    compute = r.rank.temporal_breakdown.compute_pct
    if share is None or compute is None or compute < TT.COMPUTE_MIN_PCT:
        return None
    # With the SIMT share known, the matmuls on CUDA cores are the evidence (a step without matmuls
    # has no tensor-core work to miss); older analyses only have the tensor-core share.
    if (simt is not None and simt < TT.SIMT_COMPUTE_PCT) or (
        simt is None and share >= T.TRACE_TENSOR_CORE_PCT_LOW
    ):
        return None
    evidence.append(Evidence(f"{r.label}: compute time in tensor-core kernels", share, "%"))
    if simt is not None:
        evidence.append(Evidence(f"{r.label}: compute time in SIMT (FP32/FP64 CUDA-core) matmuls", simt, "%"))
        for k in cores.top_simt_kernels[:3]:
            evidence.append(Evidence(f"{r.label}: SIMT kernel {(k.name or '?')[:120]}", k.time_ms, "ms"))
    if simt is not None:
        return clamp01(compute / 100.0 * simt / 100.0 * TT.SIMT_TIME_SAVED)
    # Older analyses without the SIMT share: half of the non-tensor compute time, as before.
    return clamp01(compute / 100.0 * (1.0 - share / 100.0) * 0.5)


def _summary(art: ArtifactAnalysis, evidence: list[Evidence]) -> float | None:
    """The impact an `nsys stats` or ncu `tensor_cores` block shows, or None.

    Same criterion as a trace: SIMT (CUDA-core) matmuls take at least `TT.SIMT_COMPUTE_PCT` of the
    compute-kernel time. Shares are of summed kernel time (a summary has no span).
    """
    block = art.ncu.tensor_cores if art.ncu.format == "ncu_csv" else art.nsys_stats.tensor_cores
    simt, share = block.simt_compute_time_pct, block.tensor_core_compute_time_pct
    if simt is None or simt < TT.SIMT_COMPUTE_PCT:
        return None
    label = A.source_label(art)
    evidence += [
        Evidence(f"{label}: compute-kernel time in tensor-core kernels", share, "%"),
        Evidence(f"{label}: compute-kernel time in SIMT (CUDA-core) matmuls, e.g. cuBLAS gemv", simt, "%"),
    ]
    pipe = block.tensor_pipe_active_pct
    if pipe is not None:
        evidence.append(Evidence(f"{label}: tensor pipe active (ncu, duration-weighted)", pipe, "%"))
    for k in block.top_simt_kernels[:3]:
        evidence.append(Evidence(f"{label}: SIMT kernel {(k.name or '?')[:120]}", k.time_ms, "ms"))
    compute = block.compute_share_of_kernel_time_pct
    return clamp01((compute if compute is not None else 100.0) / 100.0 * simt / 100.0 * TT.SIMT_TIME_SAVED)
