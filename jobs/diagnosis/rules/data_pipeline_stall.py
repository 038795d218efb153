"""data_pipeline_stall: the GPUs wait for input: regular idle gaps, host-side waits, a hot DataLoader.

Metrics, resolved regime (a stall period of at least ~4 samples, a minute or more at 15 s; the seed's "four
looks": long GPU idle -> data or CPU side): the job's utilisation drops to ~0 at regular intervals, short
each time (long idle stretches are idle_gpus), with the links quiet in the troughs (a collective moving
data in the troughs is communication_wait). Drops out of phase across nodes are input stalls too (seed:
staggered drops across machines mean the input side; synchronised drops are only called input when the
links stay quiet). Cannot see: stalls shorter than a sample.

Metrics, unresolved regime (steps of 0.1-5 s, far below 15-60 s samples): the profiling averages are flat
and GPU_UTIL's point samples (NVML's 1/6-1 s window) land at random phases of the step. Utilisation well
below 100 % with idle links and no heavy copies, and either point samples that spread down to ~0 (idle
stretches at least an NVML window long) or healthy kernels when resident, points at the host/input side
at a lower confidence; the finding names the resolution and the capture (py-spy, nsys) that confirms it.
Cannot see: whether the host waits on the DataLoader, a tokenizer, host syncs or the file system.

What a sample is, and what a stall looks like in it (jobs.diagnosis.regimes' docstring derives it): a
GPU_UTIL sample is NVML's share of its last 1/6-1 s window with a kernel resident, read when dcgm-exporter
collects (30 s by default) and served to every scrape until the next collection; the profiling fields are
collect-interval averages. A step of S seconds waiting w of it: the mean of the point samples is ~1 - w at
any window and scrape (the evidence that the GPU idles), their spread depends on the window (1/6 s: 0 or
~100 %; 1 s over a 2 s step with the wait cut per micro-batch: every sample ~1 - w, none at 0 %), and only
a stall period of >= 4 samples (60 s at 15 s scrapes) shows as gaps. So below a 50 % mean the GPU waits
more than it works whatever the spread (the seed's case 1: 33 %), and that is called an input/host stall,
not launch overhead.

Kind (jobs.diagnosis.kinds): a serving job's utilisation follows its requests, so the metric readings
here are never applied to `kind == "inference"` (its utilisation is judged against the load in
unexplained_waste / idle_gpus); with the kind unknown a metrics-only finding is info.

Host levels (node_exporter, jobs.diagnosis.host_looks), when collected, name the input side's cause with
a metrics finding: busy CPUs (CPU-bound pipeline), high iowait (storage), network RX with quiet CPUs (a
remote source), or CPUs that idle meanwhile (an unresolved finding then says "a host synchronisation or
too few workers" rather than input). Cannot see: which process uses the CPUs.

A trace, a py-spy profile: `data_pipeline_artifacts` (what each shows, and what it cannot see).
"""

from __future__ import annotations

import warnings

import numpy as np

from jobs.diagnosis import artifacts as A
from jobs.diagnosis import detectors as D
from jobs.diagnosis import kinds as K
from jobs.diagnosis import regimes as R
from jobs.diagnosis import thresholds as T
from jobs.diagnosis import trace_thresholds as TT
from jobs.diagnosis.base import DiagnosisInput, Evidence, Finding, Severity, clamp01, confidence
from jobs.diagnosis.features import Features
from jobs.diagnosis.host_looks import host_look
from jobs.diagnosis.rules.common import pct, short_idle_gaps
from jobs.diagnosis.rules.data_pipeline_artifacts import (
    host_work_title,
    pyspy_input,
    trace_advice,
    trace_host_work,
    trace_input_share,
)

CODE = "data_pipeline_stall"
RECOMMENDATION = (
    "The GPUs wait for the next batch. Tokenise/decode offline into a memory-mapped format, raise "
    "DataLoader num_workers and prefetch_factor, set pin_memory=True (and non_blocking copies) and "
    "persistent_workers=True, and read the data from local NVMe instead of network storage; then check "
    "py-spy for what the workers do."
)

HOST_WORK_ADVICE = (
    "The GPU waits for the host: between kernels, the threads that launch GPU work run CPU operators "
    "while nothing is queued on the GPU. Move that work onto the GPU (keep tensors on the device), into "
    "DataLoader workers (pre/post-processing per batch), or out of the step (every N steps); fused and "
    "foreach optimizers and torch.compile cut per-parameter host loops; record with with_stack=True (or "
    "py-spy) to find the Python lines that call the operators named in the evidence. "
)


def check(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Fire on regular synchronised idle gaps (metrics), or trace/py-spy evidence of waiting for input."""
    evidence: list[Evidence] = []
    sources: list[str] = []
    base, impact = 0.0, 0.0
    severity = Severity.INFO
    windows: list[tuple[float, float]] = []
    # A server's utilisation follows its requests: never an input stall (traces and py-spy still count).
    serving = K.is_serving(inp.kind)
    gaps = None if serving else _gaps(f)
    # A handful of "regular" gaps (too few cycles to warn) may be aliasing of a short step: when the
    # unresolved look applies with enough samples, it is the better reading.
    lk = None if serving else f.looks
    look = (
        lk is not None
        and lk.util_mean is not None
        and R.host_side_stall(lk)
        and f.samples_per_gpu >= T.MIN_SAMPLES_TO_WARN
    )
    if gaps is not None and look and _warn_if_enough(f, len(gaps[0])) is Severity.INFO:
        gaps = None
    stagger = _staggered(f) if gaps is None and not serving else None
    if stagger is not None and look and _warn_if_enough(f, stagger[2]) is Severity.INFO:
        stagger = None
    unresolved = False
    if gaps is not None:
        rs, share, period, cv = gaps
        base, severity = 0.8, _warn_if_enough(f, len(rs))
        evidence += [
            Evidence("idle gaps (all GPUs at ~0 %)", len(rs), "count"),
            Evidence("time in idle gaps", round(100 * share, 1), "%"),
            Evidence("typical gap length", round(float(np.median([b - a for a, b in rs])) * f.step), "s"),
        ]
        if period is not None:
            evidence.append(Evidence("gap period", round(period.period_s), "s"))
        if cv is not None:
            evidence.append(Evidence("variation of the interval between gaps", round(cv, 2), "CV"))
        evidence += f.resolution.evidence("resolved")
        nodes = _nodes(f)
        if nodes >= 2:
            # The seed reads drops synchronised across machines as a global sync point; with the links
            # quiet in the troughs no collective is moving data, but a host-side barrier looks the same.
            base = 0.65
            evidence.append(
                Evidence(
                    f"drops synchronised across {nodes} nodes",
                    "links quiet in the troughs: input side, unless a host-side barrier waits "
                    "(nsys -t nccl,osrt tells them apart)",
                )
            )
        windows = D.merge_windows(D.run_windows(rs, f.timestamps, f.step), gap_s=0.0)
        impact = max(share, _idle_level(f, evidence))
        sources.append("metrics")
    elif stagger is not None:
        hosts, share, gap_count, overlap = stagger
        base, severity = 0.7, _warn_if_enough(f, gap_count)
        evidence += [
            Evidence("nodes whose GPUs drop to ~0 % at regular intervals", len(hosts), "count"),
            Evidence("nodes", ", ".join(hosts[:8])),
            Evidence("overlap of the nodes' idle samples (1 = synchronised)", round(overlap, 2), "ratio"),
            Evidence("GPU time in idle gaps", round(100 * share, 1), "%"),
            *f.resolution.evidence("resolved"),
        ]
        impact = max(share, _idle_level(f, evidence))
        sources.append("metrics")
        windows = f.whole_window
    else:
        if lk is not None and lk.util_mean is not None and R.host_side_stall(lk):
            unresolved = True
            base, impact = T.UNRESOLVED_CONFIDENCE, clamp01(1.0 - lk.util_mean)
            severity = Severity.WARNING if f.samples_per_gpu >= T.MIN_SAMPLES_TO_WARN else Severity.INFO
            evidence += lk.evidence() + f.resolution.evidence("unresolved")
            sources.append("metrics")
            windows = f.whole_window
    trace_windows: list[tuple[float, float]] = []
    trace_idle = trace_input_share(inp, evidence, sources, trace_windows)
    host = trace_host_work(inp, evidence, sources, trace_windows)
    if (trace_idle is not None or host is not None) and "metrics" not in sources:
        windows = A.merge_windows(trace_windows)  # trace findings cover the captured window
    py = pyspy_input(inp, evidence, sources)
    if not sources:
        return None
    if trace_idle is not None:
        impact = max(impact, trace_idle)
        base = max(base, 0.6) + (0.1 if "metrics" in sources else 0.0)
    if py:
        base = min(base + 0.15, 0.95) if base else 0.5
        if gaps is not None or (trace_idle or 0.0) >= T.TRACE_IDLE_PCT / 100:
            severity = Severity.WARNING
    if trace_idle is not None and trace_idle >= TT.INPUT_IDLE_WARN_PCT / 100:
        severity = Severity.WARNING
    if host is not None:
        recurring, repeats, _ = host
        if trace_idle is None:
            base = max(base, 0.7) + (0.1 if "metrics" in sources else 0.0)
        impact = max(impact, recurring)
        if repeats and recurring >= TT.HOST_WORK_IDLE_PCT / 100:
            severity = Severity.WARNING
    # The host-work reading names its own cause when it is the larger trace share.
    host_first = host is not None and "metrics" not in sources and host[0] >= (trace_idle or 0.0)
    title = (
        f"The GPUs idle together every {round(gaps[2].period_s)} s waiting for input"
        if gaps is not None and gaps[2] is not None
        else f"The GPUs idle together {pct(gaps[1])} of the time waiting for input"
        if gaps is not None
        else f"GPUs on {len(stagger[0])} nodes idle out of phase ({pct(stagger[1])} of GPU time): input"
        if stagger is not None
        else f"GPU_UTIL averages {pct(lk.util_mean)} with idle time inside the steps: the GPUs wait on the "
        f"host / input pipeline (steps are shorter than the {f.resolution.sample_interval_s:g} s sampling)"
        if unresolved and lk is not None
        else host_work_title(host)
        if host is not None and host_first
        else f"In the captured trace window the GPU idles {pct(trace_idle)} of the step waiting for the "
        "DataLoader"
        if trace_idle is not None and "metrics" not in sources
        else "GPU time is lost waiting on the host / input pipeline"
    )
    # node_exporter's host levels tell a CPU- or I/O-bound input pipeline (or a remote source) from hosts
    # that idle (a synchronisation or too few workers) without a trace (jobs.diagnosis.host_looks).
    hl = host_look(f) if "metrics" in sources else None
    host_advice = ""
    if hl is not None:
        evidence += hl.evidence()
        host_advice = hl.input_advice()
        cause = hl.input_cause
        if cause in ("cpu", "io", "remote"):
            base = min(base + 0.05, 0.95)
            title += {
                "cpu": ": the input pipeline is CPU-bound (host CPUs busy)",
                "io": ": the input pipeline waits on storage (host iowait)",
                "remote": ": the input comes over the network (hosts receiving, CPUs quiet)",
            }[cause]
        elif cause == "idle" and unresolved:
            title += (
                ": the hosts' CPUs idle meanwhile -- a host synchronisation or too few DataLoader workers"
            )
    # GR_ENGINE_ACTIVE stands in for a missing GPU_UTIL; say so and trust it a little less.
    missing = f.missing(["gpu_util"]) if "metrics" in sources else []
    finding = Finding(
        code=CODE,
        severity=severity,
        confidence=confidence(
            min(base, 0.95),
            missing=missing,
            coverage=f.coverage(f.util_key) if f.util_key and "metrics" in sources else 1.0,
        ),
        title=title,
        recommendation=host_advice
        + (HOST_WORK_ADVICE if host is not None else "")
        + (
            ""
            if host_first and trace_idle is None and not py
            else trace_advice(inp)
            + RECOMMENDATION
            + (R.capture("input") if unresolved and len(sources) == 1 else "")
        ),
        evidence=evidence,
        windows=windows,
        impact=impact,
        missing_signals=missing,
        sources=sources,
    )
    return K.gate_unknown(finding, inp.kind)


def _idle_level(f: Features, evidence: list[Evidence]) -> float:
    """1 - the mean utilisation of the working GPUs: the idle time itself. The gap samples alone undercount
    it when samples between the gaps also hold idle time (a 1/6 s window lands in a sub-second wait as
    often as the wait lasts); the mean of point samples is the duty at any window. Appends its evidence."""
    lk = f.looks
    if lk is None or lk.util_mean is None:
        return 0.0
    evidence.append(
        Evidence("GPU_UTIL mean over the working GPUs (idle the rest)", round(100 * lk.util_mean, 1), "%")
    )
    return clamp01(1.0 - lk.util_mean)


def _gaps(f: Features) -> tuple[list[D.Run], float, D.Periodicity | None, float | None] | None:
    found = short_idle_gaps(f)
    if found is None:
        return None
    rs, share, in_gaps, known = found
    util = f.util
    assert util is not None  # short_idle_gaps returns None without utilisation
    if share < T.STALL_MIN_IDLE_SHARE:
        return None
    period = D.find_periodicity(util, f.step)
    cv = D.interval_cv([a for a, _ in rs])
    regular = (period is not None and period.swing >= T.SAWTOOTH_MIN_SWING) or (
        cv is not None and cv <= T.STALL_MAX_INTERVAL_CV
    )
    if not regular or aliased(f, in_gaps):
        return None
    lk = f.looks
    if links_busy_in(f, in_gaps) or (lk is not None and lk.links_busy):
        # The collective moves data in the troughs (or the links carry collective-sized traffic on
        # average, which an input-starved job does not): communication_wait.
        return None
    lost = float(np.nansum(np.clip(1.0 - util[in_gaps], 0.0, 1.0))) / max(int(known.sum()), 1)
    return rs, clamp01(lost), period, cv


def aliased(f: Features, mask: np.ndarray) -> bool:
    """The gap samples are GPU_UTIL point samples landing in a sub-second wait, not a stall a sample long.

    GPU_UTIL covers NVML's last 1/6-1 s, the profiling fields (GR_ENGINE_ACTIVE, else SM or tensor active)
    the whole collect interval (30 s by default) before the same collection. A real stall of a sample or
    more empties most of that interval too (a 30 s wait caught at a random point of it leaves ~half the
    average); with a 1/6 s window on 2 s steps waiting 2/3 of each, ~2/3 of the samples read 0 while the
    average reads the step's duty in every sample. So when the averages in the gap samples keep at least
    STALL_ALIAS_AVG_RATIO of their level elsewhere, the gaps are aliasing (the unresolved reading applies)."""
    util = f.util
    if util is None:
        return False
    for key in ("gr_engine_active", "sm_active", "tensor_active"):
        series = f.mean(key)
        if series is None:
            continue
        known = np.isfinite(series) & np.isfinite(util)
        inside, outside = series[mask & known], series[~mask & known]
        if inside.size < 3 or outside.size < 3:
            continue
        level = float(np.mean(outside))
        if level <= 0:
            continue
        return float(np.mean(inside)) >= T.STALL_ALIAS_AVG_RATIO * level
    return False


def links_busy_in(f: Features, mask: np.ndarray) -> bool:
    """NVLink (or PCIe) carries at least twice its busy-sample traffic in the masked samples (and at least
    NVLINK_TROUGH_MIN_BPS): data moves while the GPUs read idle, as in a collective behind a host barrier.
    An input stall leaves the links quieter in the troughs than when the GPUs compute."""
    for key in ("nvlink_tx_bytes", "nvlink_bandwidth_total", "pcie_tx_bytes"):
        series = f.mean(key)
        if series is None or f.util is None:
            continue
        inside = series[mask & np.isfinite(series)]
        # Against samples where every GPU computes (a half-busy sample may hold part of a trough).
        outside = series[~mask & np.isfinite(series) & (np.nan_to_num(f.util) >= T.UTIL_SATURATED_MIN)]
        if not inside.size or not outside.size:
            continue
        scale = 0.5 if key == "nvlink_bandwidth_total" else 1.0  # TX + RX
        trough, busy = float(np.mean(inside)) * scale, float(np.mean(outside)) * scale
        if trough >= T.NVLINK_TROUGH_MIN_BPS and trough >= 2.0 * busy:
            return True
    return False


def _warn_if_enough(f: Features, cycles: int) -> Severity:
    """Warning only with enough samples and cycles (a short pod shows a few cycles of anything)."""
    if f.samples_per_gpu >= T.MIN_SAMPLES_TO_WARN and cycles >= T.MIN_CYCLES_TO_WARN:
        return Severity.WARNING
    return Severity.INFO


def _nodes(f: Features) -> int:
    """Number of nodes among the job's per-GPU series (0 without per-GPU data)."""
    data = f.gpu_data((f.util_key,)) if f.util_key else None
    return len(set(data.hosts)) if data is not None else 0


def _staggered(f: Features) -> tuple[list[str], float, int, float] | None:
    """Regular idle gaps on each of several nodes, out of phase (the job mean never drops together)."""
    if f.util_key is None:
        return None
    data = f.gpu_data((f.util_key,))
    if data is None:
        return None
    hosts = sorted(set(data.hosts))
    if len(hosts) < 2:
        return None
    u = data.values[f.util_key]
    long_run = max(int(T.IDLE_MIN_STRETCH_S // data.step), 2)
    masks, shares, counts, names = [], [], [], []
    for host in hosts:
        rows = [i for i, h in enumerate(data.hosts) if h == host]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            series = np.nanmean(u[rows], axis=0)
        rs = [r for r in D.idle_gaps(series, threshold=T.STALL_UTIL_MAX) if r[1] - r[0] < long_run]
        known = np.isfinite(series)
        if len(rs) < T.STALL_MIN_GAPS or not known.any():
            continue
        mask = np.zeros(series.size, dtype=bool)
        for a, b in rs:
            mask[a:b] = True
        share = float(mask[known].mean())
        cv = D.interval_cv([a for a, _ in rs])
        period = D.find_periodicity(series, data.step)
        regular = (period is not None and period.swing >= T.SAWTOOTH_MIN_SWING) or (
            cv is not None and cv <= T.STALL_MAX_INTERVAL_CV
        )
        if share < T.STALL_MIN_IDLE_SHARE or not regular:
            continue
        lost = float(np.nansum(np.clip(1.0 - series[mask], 0.0, 1.0))) / max(int(known.sum()), 1)
        masks.append(mask)
        shares.append(lost * len(rows))
        counts.append(len(rs))
        names.append(host)
    if len(names) < 2:
        return None
    # Each exporter collects at its own phase: the same instant reaches the samples of two nodes up to one
    # collect interval apart, so each node's idle samples are widened by that much before comparing.
    widen = int(np.ceil(R.DEFAULT_COLLECT_S / data.step))
    wide = [np.convolve(m.astype(float), np.ones(2 * widen + 1), mode="same") > 0 for m in masks]
    union = np.logical_or.reduce(masks)
    inter = np.logical_and.reduce(wide) & union
    overlap = float(inter.sum() / union.sum()) if union.any() else 1.0
    if overlap >= T.SYNC_MIN_CORR:
        return None  # synchronised: the job-wide check decides
    if links_busy_in(f, np.logical_or.reduce(masks)):
        return None  # data moves in the troughs: a collective, not input
    share = clamp01(sum(shares) / len(data.gpus))
    return names, share, int(np.median(counts)), overlap
