"""host_device_copy: time goes into copies between host and GPU instead of compute.

Metrics: sustained heavy PCIe traffic per GPU (DCGM PCIE_RX/TX_BYTES). A trace measures memcpy time by
direction and whether the host side was pageable memory (pageable copies are synchronous and slow). An
`nsys stats` memory summary gives copy time per operation; its Unified Memory page migrations (HtoD/DtoH)
count as host<->device time too. A summary cannot tell when the copies ran, nor whether they overlapped
kernels: its share is of copy + kernel time.

Samples: PCIE_RX/TX_BYTES are DCGM profiling fields averaged over the collect interval (30 s by default),
read as B/s; at 5-60 s scrapes they are a level of the job's traffic, and a copy burst shorter than the
interval is averaged in (a 1 s, 25 GB copy every 10 s reads 2.5 GB/s). NIC traffic of GPUDirect RDMA also
crosses PCIe, so heavy PCIe with busy links and saturated utilisation is read as a collective instead.
"""

from __future__ import annotations

from jobs.diagnosis import artifacts as A
from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import DiagnosisInput, Evidence, Finding, Severity, clamp01, confidence
from jobs.diagnosis.features import Features
from jobs.diagnosis.rules.common import busy_share, ratio_ev, util_level

CODE = "host_device_copy"
RECOMMENDATION = (
    "Data moves between host and GPU inside the step. Keep tensors on the GPU across steps (no .cpu() / "
    ".numpy() / .to('cpu') in the loop), issue copies ahead of use with non_blocking=True, and move "
    "preprocessing (augmentation, tokenisation output) to the GPU or into the input pipeline's workers."
)
#: Prefixes that match what the trace shows about the host side of the copies.
PAGEABLE_ADVICE = (
    "Most copies use pageable host memory: pin it (DataLoader pin_memory=True, tensor.pin_memory()), "
    "so copies run asynchronously at full PCIe bandwidth. "
)
PINNED_NOTE = "The copies already use pinned host memory, so their cost is the volume moved. "
UNKNOWN_MEMORY_ADVICE = "If the host buffers are pageable, pin them (DataLoader pin_memory=True). "
#: Trace: host<->device memcpy time as a share of the whole traced GPU span (not only of its busy part)
#: below this makes the finding info: the copies cost under 2 % of the GPU's time, however large their
#: share of the little work a mostly idle trace shows.
MEMCPY_SPAN_PCT = 2.0
_HOST_KINDS = ("HtoD", "DtoH", "HtoA", "AtoH", "HtoH")
#: nsys stats prints Unified Memory page migrations as "[CUDA Unified Memory memcpy HtoD/DtoH]" (read as
#: "Unified Memory HtoD" ...): host<->device traffic too, paid on page faults instead of explicit copies.
UNIFIED_MEMORY = "Unified Memory "
UNIFIED_MEMORY_ADVICE = (
    "Most of the copy time is Unified Memory page migration (cudaMallocManaged pages faulted across PCIe): "
    "prefetch the pages before the kernels that touch them (cudaMemPrefetchAsync, cudaMemAdvise) or copy "
    "explicitly. "
)


def check(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Fire on heavy sustained PCIe traffic, or on a trace where host<->device memcpy takes real GPU time."""
    evidence: list[Evidence] = []
    sources: list[str] = []
    missing: list[str] = []
    base, impact = 0.0, 0.0
    rx, tx = f.level("pcie_rx_bytes"), f.level("pcie_tx_bytes")
    heaviest = max(rx or 0.0, tx or 0.0)
    if heaviest >= T.PCIE_HEAVY_BPS:
        base = 0.75
        util = util_level(f)
        evidence += [
            Evidence("PCIe host-to-device while busy, median", _gbps(rx), "GB/s per GPU"),
            Evidence("PCIe device-to-host while busy, median", _gbps(tx), "GB/s per GPU"),
            ratio_ev("GPU utilisation, median", util),
            ratio_ev("SM active while busy, median", f.level("sm_active")),
        ]
        # GPU time not spent in kernels while traffic is heavy is what the copies cost, at most.
        impact = busy_share(f) * clamp01(1.0 - (util or 1.0)) if util is not None else 0.05
        impact = max(impact, 0.05)
        sources.append("metrics")
    elif rx is None and tx is None:
        missing += f.missing(["pcie_rx_bytes", "pcie_tx_bytes"])
    pageable = False
    pinned = False
    minor: list[bool] = []  # per trace rank: its copies are a large share of almost no GPU work
    windows: list[tuple[float, float]] = []
    for r in A.trace_ranks(inp):
        share, pg = _trace_share(r)
        if share is None or share < T.MEMCPY_SHARE_PCT:
            continue
        busy = 1.0 - (r.rank.temporal_breakdown.idle_pct or 0.0) / 100.0
        minor.append(share * busy < MEMCPY_SPAN_PCT)
        evidence.append(Evidence(f"{r.label}: host<->device memcpy", round(share, 1), "% of GPU busy time"))
        for kind in r.rank.memcpy.by_kind:
            if kind.copy_kind in _HOST_KINDS:
                evidence.append(Evidence(f"{r.label}: {kind.copy_kind} copies", kind.time_ms, "ms"))
        if pg is not None:
            evidence.append(Evidence(f"{r.label}: pageable host memory", round(pg, 1), "% of host bytes"))
            pageable = pageable or pg >= T.PAGEABLE_PCT
            pinned = pinned or pg < T.PAGEABLE_PCT
        windows += r.windows
        impact = max(impact, clamp01(share / 100.0 * busy))
        base = max(base, 0.7) + (0.1 if "metrics" in sources else 0.0)
        if r.source not in sources:
            sources.append(r.source)
    migrations_ms = copies_ms = 0.0
    for art in A.nsys_stats(inp):
        stats = art.nsys_stats
        ops = stats.memory_ops.by_operation
        host_ms = sum(o.total_time_ms or 0.0 for o in ops if o.operation in _HOST_KINDS)
        um_ms = sum(o.total_time_ms or 0.0 for o in ops if _unified_memory(o.operation))
        kernel_ms = stats.kernels.total_time_ms
        moved_ms = host_ms + um_ms
        if kernel_ms and moved_ms / (moved_ms + kernel_ms) * 100 >= T.MEMCPY_SHARE_PCT:
            if host_ms or not um_ms:
                evidence.append(
                    Evidence(f"{A.source_label(art)}: host<->device memcpy time", round(host_ms, 3), "ms")
                )
            if um_ms:
                evidence.append(
                    Evidence(f"{A.source_label(art)}: Unified Memory page migrations", round(um_ms, 3), "ms")
                )
            migrations_ms += um_ms
            copies_ms += host_ms
            base = max(base, 0.6)
            sources.append("nsys stats")
    if not sources:
        return None
    # Advice follows what the trace shows: pageable copies get "pin it", pinned ones do not.
    if pageable:
        recommendation = PAGEABLE_ADVICE + RECOMMENDATION
    elif pinned:
        recommendation = PINNED_NOTE + RECOMMENDATION
    elif migrations_ms > copies_ms:
        recommendation = UNIFIED_MEMORY_ADVICE + RECOMMENDATION
    else:
        recommendation = UNKNOWN_MEMORY_ADVICE + RECOMMENDATION
    trace_only = "metrics" not in sources
    # A large share of the little GPU work of a mostly idle trace: worth knowing, not a warning.
    only_minor = trace_only and "nsys stats" not in sources and bool(minor) and all(minor)
    severity = Severity.INFO if only_minor else Severity.WARNING
    return Finding(
        code=CODE,
        severity=severity,
        confidence=confidence(
            min(base, 0.95),
            missing=missing,
            coverage=f.coverage("pcie_rx_bytes") if "metrics" in sources else 1.0,
        ),
        title=(
            f"Host<->GPU copies: {_gbps(heaviest)} GB/s of PCIe traffic per GPU"
            if "metrics" in sources
            else "In the captured trace window, host<->GPU memcpy takes a large share of GPU time"
        ),
        recommendation=recommendation,
        evidence=evidence,
        windows=A.merge_windows(windows) if trace_only else f.whole_window,
        impact=impact,
        missing_signals=missing,
        sources=sources,
    )


def _unified_memory(operation: str | None) -> bool:
    """An nsys stats Unified Memory migration between host and device (not device-to-device)."""
    op = operation or ""
    return op.startswith(UNIFIED_MEMORY) and op[len(UNIFIED_MEMORY) :] in _HOST_KINDS


def _gbps(value: float | None) -> float | None:
    return None if value is None else round(value / 1e9, 2)


def _trace_share(r: A.RankView) -> tuple[float | None, float | None]:
    host_ms = sum(k.time_ms or 0.0 for k in r.rank.memcpy.by_kind if k.copy_kind in _HOST_KINDS)
    compute = r.rank.temporal_breakdown.compute_ms
    non_compute = r.rank.temporal_breakdown.non_compute_ms
    busy = (compute or 0.0) + (non_compute or 0.0)
    if not host_ms or busy <= 0:
        return None, r.rank.memcpy.pageable_bytes_pct
    return min(100.0, 100.0 * host_ms / busy), r.rank.memcpy.pageable_bytes_pct
