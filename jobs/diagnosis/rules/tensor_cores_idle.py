"""tensor_cores_idle: a bf16/fp16 (tensor-core dtype) job whose SMs are busy but not on tensor cores.

Seed: a job that claims bf16 with PIPE_TENSOR_ACTIVE below 30 % wastes its compute. Memory-bound work also
leaves the tensor pipes idle; that has its own rule, so high DRAM activity keeps this one quiet.
"""

from __future__ import annotations

from jobs.diagnosis import artifacts as A
from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import DiagnosisInput, Evidence, Finding, Severity, clamp01, confidence
from jobs.diagnosis.features import Features
from jobs.diagnosis.rules.common import busy_share, pct, ratio_ev, saturated
from jobs.evaluation.catalog import normalise_dtype

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
    if dtype not in T.TENSOR_DTYPES:
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
            if saturated(f) and tensor < T.TENSOR_ACTIVE_VERY_LOW and working:
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
    for r in A.trace_ranks(inp):
        share = r.n("tensor_cores", "tensor_core_compute_time_pct")
        compute = r.n("temporal_breakdown", "compute_pct")
        if share is None or compute is None or share >= T.TRACE_TENSOR_CORE_PCT_LOW or compute < 20.0:
            continue
        evidence.append(Evidence(f"{r.label}: compute time in tensor-core kernels", share, "%"))
        if r.source not in sources:
            sources.append(r.source)
        base = max(base, 0.5)
        impact = max(impact, clamp01(compute / 100.0 * (1.0 - share / 100.0) * 0.5))
    if not sources:
        return None
    if "metrics" in sources and len(sources) > 1:
        base += 0.05
    title = (
        f"A {dtype} job with tensor cores active only {pct(tensor)} of the time"
        f"{f' while SMs are {pct(sm)} active' if sm is not None else ''}"
        if "metrics" in sources
        else f"A {dtype} job whose compute kernels rarely use tensor cores"
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
        windows=f.whole_window if "metrics" in sources else [],
        impact=impact,
        missing_signals=missing,
        sources=sources,
    )
