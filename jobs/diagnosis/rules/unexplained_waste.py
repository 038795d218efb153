"""unexplained_waste: the job wastes material money and no finding explains it — never silent about money.

A symptom-like catch-all. `check` proposes it whenever the job's waste/day (or, with MFU unknown, its
idle waste: the stated lower bound) reaches `DiagnosisInput.material_waste_usd_per_day`; the engine
(`engine.account_unexplained`) keeps it only when, after the other findings got their dollars, at least
that much is left, and gives it exactly what is left. Its evidence says what the signals show at their
resolution (the four looks as levels), which signals are missing, and what to capture next.

On a serving job (kind inference) the unused capacity is read against the load (jobs.diagnosis.kinds:
utilisation, its correlation with tokens/s where exported) and the advice is right-sizing, batching and
autoscaling, not a capture of training steps.

What it cannot see: anything — it is the statement that the metrics at this resolution did not name a
cause. A per-step pattern shorter than ~4 samples, a cause only a trace shows (host syncs, pageable
copies, a slow kernel) and a wrong reference MFU all end here.
"""

from __future__ import annotations

from jobs.diagnosis import kinds as K
from jobs.diagnosis import regimes as R
from jobs.diagnosis.base import DiagnosisInput, Evidence, Finding, Severity, clamp01
from jobs.diagnosis.features import Features

CODE = "unexplained_waste"
#: Signals whose absence most limits the diagnosis, with what each hides.
KEY_SIGNALS: dict[str, str] = {
    "gpu_util": "idle time and its spread (input stalls)",
    "sm_active": "how full the SMs are inside kernels (off in dcgm-exporter's default counters)",
    "tensor_active": "tensor-core use",
    "dram_active": "memory-bound kernels",
    "nvlink_tx_bytes": "collective traffic (NVLINK_BANDWIDTH_TOTAL stands in)",
    "pcie_rx_bytes": "host-device copies and NIC traffic",
    "sm_clock": "throttling",
}


def check(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Propose the finding when the job's waste (or its idle lower bound) is material; the engine decides."""
    cost = inp.cost_per_day_usd
    waste = inp.waste_per_day_usd if inp.waste_per_day_usd is not None else inp.idle_waste_per_day_usd
    if waste is None or waste < inp.material_waste_usd_per_day or not cost or cost <= 0:
        return None
    lower_bound = inp.waste_per_day_usd is None
    missing = [k for k in KEY_SIGNALS if f.coverage(k) <= 0.0]  # absent, or present without a sample
    if "nvlink_tx_bytes" in missing and f.coverage("nvlink_bandwidth_total") > 0.0:
        missing.remove("nvlink_tx_bytes")
    evidence = [
        Evidence(
            "waste/day of the job" + (" (lower bound: idle GPUs only)" if lower_bound else ""),
            round(waste, 2),
            "USD/day",
        ),
        Evidence("MFU", None if inp.mfu is None else round(100 * inp.mfu, 1), "%"),
        Evidence(
            "reference MFU", None if inp.reference_mfu is None else round(100 * inp.reference_mfu, 1), "%"
        ),
    ]
    serving = K.is_serving(inp.kind)
    reading = K.load_reading(f) if serving else None
    lk = f.looks
    if reading is not None:
        # A server's utilisation is judged against its load (jobs.diagnosis.kinds), not as step causes.
        evidence += reading.evidence()
    elif lk is not None:
        evidence += lk.evidence()
    if f.sigs is not None and f.timestamps.size:
        evidence += f.resolution.evidence("unresolved")
    else:
        evidence.append(Evidence("signals", "no DCGM samples for this job"))
    for key in missing:
        evidence.append(Evidence(f"missing: {key}", KEY_SIGNALS[key]))
    return Finding(
        code=CODE,
        severity=Severity.INFO,  # the engine raises it when the unexplained share is large
        confidence=0.3,
        title="Waste that no finding explains",
        recommendation=(
            K.SERVING_ADVICE
            if serving
            else "The metrics at this resolution do not name a cause for this job's lost MFU. Check the "
            "job's model shape and dtype (a wrong FLOPs count or peak makes MFU wrong), enable the missing "
            "signals listed in the evidence (dcgm-exporter counters CSV), and capture a few steps."
            + R.capture("any")
        ),
        evidence=evidence,
        windows=f.whole_window,
        impact=clamp01(waste / cost),
        missing_signals=missing,
        sources=["metrics"] if f.sigs is not None else [],
    )
