"""communication_wait: ranks block together in collectives.

Metrics, resolved regime (a period of at least ~4 samples): SM/tensor activity rises and falls periodically,
in lock-step on every GPU, while GPU_UTIL stays high (NCCL kernels spin while they wait), often with NVLink
bursts in the troughs; or GPU_UTIL itself drops on every GPU together while the links carry more than
when the GPUs compute (a collective behind a host-side barrier: the GPUs empty, the data still moves).
Synchronised drops with quiet links are read as input stalls (data_pipeline_stall); a spin with quiet
links still shows as the SM sawtooth. Cannot see: collectives shorter than a sample.

Metrics, unresolved regime (steps of 0.1-5 s): the four looks as levels. Heavy NVLink traffic (or NIC
traffic over PCIe while GPU_UTIL reads ~100 %) with tensor active (or, without it, SM active) per unit of
busy time below its healthy level points at exposed collectives, at a lower confidence, naming the
resolution and the nsys capture (`-t nccl`) that confirms it. Cannot see: which collective, the overlap,
a single slow rank.

Samples (jobs.diagnosis.regimes): in a spinning collective GPU_UTIL reads ~100 % at a 1/6 s or 1 s window
(an NCCL kernel is resident), SM_ACTIVE averages NCCL's channel level (~0.1-0.2) with the compute level
over the collect interval, so the mean SM activity of a comm-bound job lands anywhere in 20-80 % and no
SM ceiling is used: the unresolved look is busy links with the tensor pipes below their healthy level per
unit of busy time (seed case 2: GPU_UTIL 100 %, SM 64.5 %, tensor low, heavy NVLink). A drop (host-side
barrier) reads like an input stall in GPU_UTIL at any window and is told apart only by the traffic. An
exposed collective of ~10 % of the step carries less than NVLINK_BUSY_BPS on average and is not separable
from a healthy step's overlapped traffic here.

Host levels (node_exporter, jobs.diagnosis.host_looks), when collected for a job on several hosts: its
InfiniBand traffic says whether the collectives cross nodes over the network (a network wait) or the
links between hosts stay quiet (waiting for a peer). Cannot see: which collective uses the traffic, or
Ethernet/RoCE NICs that node_exporter's InfiniBand collector does not list.

A trace measures it directly: communication kernel time not overlapped with compute. With the traces of
several ranks of one capture (`jobs.diagnosis.cross_rank`) it also tells a late rank from the network: the
rank that arrives last waits least in NCCL, so its NCCL time is the collective itself and the others' extra
NCCL time is waiting for it; the finding then says so, and keeps as its impact only the collective's own
part (the waiting is the straggler finding's). Cannot see from one rank's trace: whether it waits for a
peer or for the network. The "communication share of step" it quotes is the step breakdown's, which
without ProfilerStep is measured over the GPU's steady state (first kernel to last GPU activity), so
start-up does not dilute it; exposed communication is a share of the GPU span (HTA's), never of the host's
extent. A host thread inside a collective call while the GPU idles is counted apart from host CPU work
(data_pipeline_stall's host-work reading) in the analysis' ``host_work.communication_pct``.
"""

from __future__ import annotations

import numpy as np

from jobs.diagnosis import artifacts as A
from jobs.diagnosis import cross_rank as X
from jobs.diagnosis import detectors as D
from jobs.diagnosis import regimes as R
from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import DiagnosisInput, Evidence, Finding, Severity, clamp01, confidence
from jobs.diagnosis.features import Features
from jobs.diagnosis.host_looks import host_look
from jobs.diagnosis.rules.common import pct, short_idle_gaps, util_level
from jobs.diagnosis.rules.data_pipeline_stall import links_busy_in

CODE = "communication_wait"
RECOMMENDATION = (
    "The GPUs spend part of every step waiting in collectives. Overlap communication with compute (DDP "
    "bucket_cap_mb, FSDP forward/backward prefetch, gradient accumulation with no_sync), check the "
    "interconnect (NCCL_DEBUG=INFO topology, NVLink/InfiniBand errors, nodes on different switches), and "
    "look for one slow rank that everybody waits for."
)


def check(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Fire on a synchronised SM/tensor sawtooth with steady utilisation, or on exposed trace comm time."""
    evidence: list[Evidence] = []
    sources: list[str] = []
    missing: list[str] = []
    base, impact, windows = 0.0, 0.0, []
    severity = Severity.INFO
    metric = _metric_pattern(f)
    drop = _drop_pattern(f) if metric is None else None
    lk = f.looks
    unresolved = (
        metric is None and drop is None and lk is not None and lk.util_mean is not None and R.collective(lk)
    )
    if metric is not None:
        key, series, period, sync, nvlink_phase = metric
        base = 0.75
        severity = _warn_if_enough(f, period.cycles)
        evidence += [
            Evidence(f"{key} sawtooth period", round(period.period_s), "s"),
            Evidence(f"{key} autocorrelation at the period", round(period.acf, 3), "r"),
            Evidence(f"{key} swing, peak to trough", round(100 * period.swing, 1), "% of its level"),
        ]
        if sync is not None:
            evidence.append(
                Evidence("correlation of each GPU with its peers, median", round(sync.median_corr, 3), "r")
            )
            base += 0.1
        else:
            missing.append("per-GPU series")
        if nvlink_phase is not None:
            evidence.append(
                Evidence("NVLink traffic vs SM activity correlation", round(nvlink_phase, 3), "r")
            )
            if nvlink_phase < -0.2:
                base += 0.05  # bursts of traffic in the troughs: the waits are collectives
        missing += f.missing(["sm_active", "nvlink_tx_bytes"])
        cycle = D.folded_cycle(series, period.period_samples)
        peak = float(np.nanmax(cycle))
        impact = clamp01(1.0 - float(np.nanmean(cycle)) / peak) if peak > 0 else 0.0
        evidence += f.resolution.evidence("resolved")
        sources.append("metrics")
        windows = f.whole_window
    elif drop is not None:
        rs, share, cycles = drop
        base, impact = 0.65, share
        severity = _warn_if_enough(f, cycles)
        evidence += [
            Evidence("drops of GPU_UTIL on all GPUs together", len(rs), "count"),
            Evidence("time in the drops", round(100 * share, 1), "%"),
            Evidence("links in the drops", "carry more than while the GPUs compute (data still moves)"),
            *f.resolution.evidence("resolved"),
        ]
        windows = D.merge_windows(D.run_windows(rs, f.timestamps, f.step), gap_s=0.0)
        sources.append("metrics")
    elif unresolved and lk is not None:
        base = T.UNRESOLVED_CONFIDENCE
        severity = Severity.WARNING if f.samples_per_gpu >= T.MIN_SAMPLES_TO_WARN else Severity.INFO
        # The share of the step the SMs are not doing healthy work, scaled: the collective's share.
        level = (
            lk.sm / T.SM_ACTIVE_HEALTHY if lk.sm is not None else (lk.tensor or 0.0) / T.TENSOR_ACTIVE_HEALTHY
        )
        impact = clamp01(1.0 - level)
        evidence += lk.evidence() + f.resolution.evidence("unresolved")
        missing += f.missing(["sm_active", "nvlink_tx_bytes"])
        sources.append("metrics")
        windows = f.whole_window
    trace_windows: list[tuple[float, float]] = []
    trace_share = _trace(inp, evidence, sources, trace_windows)
    stats_share = _nsys_stats(inp, evidence, sources)
    if not sources:
        return None
    if "metrics" not in sources and trace_windows:
        # A trace-only finding covers what the trace captured, not the whole job.
        windows = A.merge_windows(trace_windows)
    late = _late_rank(inp, evidence) if trace_share else None
    if late is not None:
        # The skew is the straggler's cost: what is left here is the collective itself.
        trace_share *= late.least_ms / max(late.least_ms + late.wait_ms, 1e-9)
    exposed = max(trace_share, stats_share)
    if exposed:
        base = max(base, 0.7) + (0.1 if "metrics" in sources else 0.0)
        impact = max(impact, exposed)
        if exposed * 100 >= T.EXPOSED_COMM_HIGH_PCT or trace_share:
            severity = Severity.WARNING
    title = (
        f"Ranks wait in collectives together: a sawtooth every {round(metric[2].period_s)} s on all GPUs"
        if metric is not None
        else f"All GPUs drop out together while the links move data ({pct(drop[1])} of the time): "
        "collectives behind a host-side barrier"
        if drop is not None
        else f"Heavy link traffic while SM activity stays at {pct(lk.sm if lk.sm is not None else lk.tensor)}"
        f" {'(SM active)' if lk.sm is not None else '(tensor active)'}: exposed collectives (steps are "
        f"shorter than the {f.resolution.sample_interval_s:g} s sampling)"
        if unresolved and lk is not None
        else f"In the captured trace window, communication not overlapped with compute takes "
        f"{100 * exposed:.1f} % of the time"
    )
    # InfiniBand between the job's hosts (node_exporter, jobs.diagnosis.host_looks): traffic says the
    # collectives cross nodes over the network; quiet IB between several hosts says the ranks wait for a
    # peer (or NVLink-only traffic) rather than for the network.
    hl = host_look(f) if "metrics" in sources else None
    if hl is not None and hl.network_busy is not None and hl.hosts >= 2:
        evidence += [e for e in hl.evidence() if e.label.startswith(("InfiniBand", "host CPUs"))]
        title += (
            f"; InfiniBand carries {(hl.ib_bps or 0.0) / 1e9:.2g} GB/s per host: a network wait between nodes"
            if hl.network_busy
            else f"; InfiniBand is quiet between the {hl.hosts} hosts: waiting for a peer, not the network"
        )
    if late is not None:
        title += (
            f"; most of the NCCL time is waiting for {late.late_names}, which arrives last (it spends "
            f"{late.least_ms:.3g} ms per step in NCCL, the others up to {late.most_ms:.3g} ms): a late rank, "
            "not the network"
        )
    return Finding(
        code=CODE,
        severity=severity,
        confidence=confidence(
            min(base, 0.95),
            missing=missing,
            coverage=f.coverage(metric[0])
            if metric is not None
            else f.coverage(f.util_key)
            if f.util_key
            else 1.0,
        ),
        title=title,
        recommendation=RECOMMENDATION + (R.capture("collective") if unresolved and len(sources) == 1 else ""),
        evidence=evidence,
        windows=windows,
        impact=impact,
        missing_signals=missing,
        sources=sources,
    )


def _metric_pattern(
    f: Features,
) -> tuple[str, np.ndarray, D.Periodicity, D.Synchrony | None, float | None] | None:
    """(signal, its mean series, the period, cross-GPU synchrony, NVLink correlation) of a sawtooth."""
    util = util_level(f)
    if util is None or util < T.COMM_UTIL_MIN:
        return None
    if f.util is not None:
        # A periodic drop of GPU_UTIL itself is an input stall, not a collective wait.
        u = D.find_periodicity(f.util, f.step)
        if u is not None and u.swing >= T.SAWTOOTH_MIN_SWING:
            return None
    for key in ("sm_active", "tensor_active"):
        series = f.mean(key)
        if series is None:
            continue
        period = D.find_periodicity(series, f.step)
        if period is None or period.swing < T.SAWTOOTH_MIN_SWING:
            continue
        data = f.gpu_data((key,))
        sync = None
        if data is not None and data.values[key].shape[0] >= 2 and data.step <= period.period_s / 2:
            sync = D.synchrony(data.values[key], detrend_window=4 * period.period_samples + 1)
            if sync is not None and sync.median_corr < T.SYNC_MIN_CORR:
                continue  # GPUs cycle independently: not a collective
        nvl = f.mean("nvlink_tx_bytes")
        phase = (
            D.correlation(
                D.detrend(series, 4 * period.period_samples + 1),
                D.detrend(nvl, 4 * period.period_samples + 1),
            )
            if nvl is not None
            else None
        )
        return key, series, period, sync, phase
    return None


def _warn_if_enough(f: Features, cycles: float) -> Severity:
    if f.samples_per_gpu >= T.MIN_SAMPLES_TO_WARN and cycles >= T.MIN_CYCLES_TO_WARN:
        return Severity.WARNING
    return Severity.INFO


def _drop_pattern(f: Features) -> tuple[list[D.Run], float, int] | None:
    """Synchronised, regular drops of the job's mean utilisation while the links stay busy."""
    gaps = short_idle_gaps(f)
    if gaps is None:
        return None
    rs, share, mask, known = gaps
    util = f.util
    assert util is not None  # short_idle_gaps returns None without utilisation
    cv = D.interval_cv([a for a, _ in rs])
    period = D.find_periodicity(util, f.step)
    regular = (period is not None and period.swing >= T.SAWTOOTH_MIN_SWING) or (
        cv is not None and cv <= T.STALL_MAX_INTERVAL_CV
    )
    if share < T.STALL_MIN_IDLE_SHARE or not regular or not links_busy_in(f, mask):
        return None
    lost = float(np.nansum(np.clip(1.0 - util[mask], 0.0, 1.0))) / max(int(known.sum()), 1)
    return rs, clamp01(lost), len(rs)


def _trace(
    inp: DiagnosisInput, evidence: list[Evidence], sources: list[str], windows: list[tuple[float, float]]
) -> float:
    worst = 0.0
    for r in A.trace_ranks(inp):
        comm = r.rank.comm_compute_overlap.communication_ms
        span = r.rank.temporal_breakdown.span_ms
        if not comm or not span:
            continue
        overlap = r.rank.comm_compute_overlap.overlap_pct or 0.0
        exposed_pct = 100.0 * comm * (1.0 - overlap / 100.0) / span
        poor = overlap < T.OVERLAP_LOW_PCT
        if exposed_pct >= T.EXPOSED_COMM_HIGH_PCT or (exposed_pct >= T.EXPOSED_COMM_PCT and poor):
            evidence += [
                Evidence(f"{r.label}: communication kernel time", round(comm, 3), "ms"),
                Evidence(f"{r.label}: overlapped with compute", round(overlap, 1), "%"),
                Evidence(f"{r.label}: exposed communication", round(exposed_pct, 2), "% of span"),
            ]
            share = r.rank.step_breakdown.communication_pct
            if share is not None:
                evidence.append(Evidence(f"{r.label}: communication share of step", round(share, 2), "%"))
            worst = max(worst, exposed_pct / 100.0)
            windows.extend(r.windows)
            if r.source not in sources:
                sources.append(r.source)
    return worst


def _late_rank(inp: DiagnosisInput, evidence: list[Evidence]) -> X.Imbalance | None:
    """The worst cross-rank imbalance with named late ranks, its decomposition added to `evidence`."""
    found = [c for c in X.imbalances(inp) if c.late]
    if not found:
        return None
    worst = found[0]
    evidence += [
        Evidence("collective itself: the late rank's NCCL time per step", round(worst.least_ms, 3), "ms"),
        Evidence(f"waiting for {worst.late_names}: mean over ranks per step", round(worst.wait_ms, 3), "ms"),
        Evidence("NCCL time per step, least to most", f"{worst.least_ms:.3g}-{worst.most_ms:.3g}", "ms"),
    ]
    return worst


def _nsys_stats(inp: DiagnosisInput, evidence: list[Evidence], sources: list[str]) -> float:
    worst = 0.0
    for art in A.nsys_stats(inp):
        share = art.nsys_stats.kernels.nccl_time_share_pct
        if share is not None and share >= T.EXPOSED_COMM_HIGH_PCT:
            evidence.append(Evidence(f"{A.source_label(art)}: NCCL share of kernel time", share, "%"))
            worst = max(worst, share / 100.0 * 0.5)  # overlap unknown: assume half is hidden
            if "nsys stats" not in sources:
                sources.append("nsys stats")
    return worst
