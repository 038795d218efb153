"""gpu_errors: XID errors and DCGM health fields during the job.

XID (DCGM_FI_DEV_XID_ERRORS: the last XID code, 0 = none): any non-zero code in the window matters; codes
that point at hardware (ECC, fallen off the bus, NVLink, GSP, row remapping) are critical.

Health fields (`HEALTH`; names, types and defaults from NVIDIA/dcgm-exporter etc/default-counters.csv,
meanings from DCGM's "Field Identifiers" and NVIDIA's "GPU Memory Error Management" guide): ECC single- and
double-bit volatile counts, pages retired or pending retirement (dynamic page retirement, before Ampere),
rows remapped after correctable/uncorrectable errors and the row-remap failure/pending flags (A100 and
newer), NVLink CRC (flit and data), replay and recovery error counts, PCIe replays. Counts are cumulative
since the driver loaded: only how much they rose inside the job's window counts (`counter_increase`; a
drop is a reset by a driver reload or GPU reset and the new count is all new), never the absolute value,
which carries every earlier job's errors. Flags (row remap failure/pending) and pages pending retirement
are states: any sample above zero in the window counts.

Resolution: XID is the last code seen; one sample is enough (no minimum of samples), but an error that
clears between two samples is missed. A counter's rise before the job's first sample in the window (at
most one scrape) is not seen; with cross-GPU aggregates only (no per-GPU rows), rises are counted only
between points with the same number of GPUs reporting and a reset is not seen (a lower bound), and which
GPU rose is unknown.

Cannot see: fields the exporter does not collect (the ECC, retired-page and NVLink error counters are
commented out of dcgm-exporter's default CSV; ROW_REMAP_PENDING is not in it), errors on GPUs outside the
job, and the node's other components (NICs, host memory; node_exporter's series are read by other rules).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from jobs.diagnosis import detectors as D
from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import DiagnosisInput, Evidence, Finding, Severity, clamp01, confidence
from jobs.diagnosis.features import Features

CODE = "gpu_errors"
RECOMMENDATION = (
    "The GPU driver reported XID errors. Look each code up in NVIDIA's XID catalogue; hardware codes (48, "
    "63/64, 74, 79, 92, 94/95, 119/120) mean the node needs a health check (dcgmi diag -r 3, ECC and "
    "row-remapping counters) before it runs more jobs; restart from the last checkpoint on healthy nodes."
)


@dataclass(frozen=True, slots=True)
class Health:
    """One DCGM health field: what a rise (or a set flag) means and what the operator should do."""

    key: str
    what: str  # evidence label for the count
    kind: Literal["increase", "state"]
    severity: Severity
    meaning: str
    action: str


_RMA_GUIDE = "NVIDIA's GPU Memory Error Management guide"
HEALTH: tuple[Health, ...] = (
    Health("ecc_dbe_volatile", "uncorrectable (double-bit) ECC errors", "increase", Severity.CRITICAL,
           "device memory lost data the ECC could not correct (the driver also reports XID 48, or 94/95 "
           "on A100 and newer)",
           "restart the job from its last checkpoint on healthy GPUs (results since the error may be "
           "corrupt); drain the node and reset the GPU so the row remap or page retirement takes effect; "
           f"RMA it if the errors recur ({_RMA_GUIDE})"),
    Health("uncorrectable_remapped_rows", "HBM rows remapped after uncorrectable errors", "increase",
           Severity.CRITICAL,
           "an uncorrectable error hit device memory and its row was remapped to a spare row, effective "
           "after the next GPU reset",
           "drain the node and reset the GPU (nvidia-smi -r) before it runs more jobs; restart the job from "
           "its last checkpoint"),
    Health("row_remap_failure", "GPUs whose row remapping failed", "state", Severity.CRITICAL,
           "the GPU had no spare row left to remap a failing one: its memory can no longer be repaired",
           f"drain the node and RMA the GPU ({_RMA_GUIDE})"),
    Health("retired_dbe", "pages retired after double-bit errors", "increase", Severity.CRITICAL,
           "uncorrectable errors made the driver retire device-memory pages (dynamic page retirement)",
           "drain the node and reset the GPU so the retirement applies; RMA it when the retired pages near "
           "the limit (nvidia-smi -q -d PAGE_RETIREMENT)"),
    Health("nvlink_recovery_errors", "NVLink recovery errors", "increase", Severity.CRITICAL,
           "an NVLink link failed and was retrained; collectives stall meanwhile, and repeated recoveries "
           "end in XID 74",
           "drain the node and run dcgmi diag -r 3; a link that keeps recovering needs the vendor (board, "
           "NVSwitch port or cable)"),
    Health("row_remap_pending", "GPUs with a row remap pending", "state", Severity.WARNING,
           "a row remap is waiting for a GPU reset to take effect",
           "drain the node and reset the GPU once it is idle"),
    Health("retired_pending", "pages pending retirement", "state", Severity.WARNING,
           "pages are waiting for a GPU reset to be retired",
           "drain the node and reset the GPU once it is idle"),
    Health("nvlink_crc_flit_errors", "NVLink flow-control CRC errors", "increase", Severity.INFO,
           "NVLink flits failed their CRC and were replayed (no data lost, bandwidth lost)",
           "check nvidia-smi nvlink -e; if the count keeps rising drain the node and run dcgmi diag -r 3"),
    Health("nvlink_crc_data_errors", "NVLink data CRC errors", "increase", Severity.INFO,
           "NVLink data failed its CRC and was replayed (no data lost, bandwidth lost)",
           "check nvidia-smi nvlink -e; if the count keeps rising drain the node and run dcgmi diag -r 3"),
    Health("nvlink_replay_errors", "NVLink replays", "increase", Severity.INFO,
           "NVLink retransmitted data (no data lost, bandwidth lost)",
           "check nvidia-smi nvlink -e; if the count keeps rising drain the node and run dcgmi diag -r 3"),
    Health("pcie_replay", "PCIe replays", "increase", Severity.INFO,
           "the PCIe link retried transfers (signal integrity): slower host-device copies",
           "check the link's width, speed and AER errors (lspci -vv); reseat or replace the riser or "
           "card if the count keeps rising"),
    Health("ecc_sbe_volatile", "corrected (single-bit) ECC errors", "increase", Severity.INFO,
           "device memory errors the ECC corrected (no data lost)",
           "nothing for the job; a GPU whose corrected errors keep rising remaps rows and may need "
           "replacing"),
    Health("correctable_remapped_rows", "HBM rows remapped after correctable errors", "increase",
           Severity.INFO, "rows with repeated corrected errors were remapped to spares (no data lost)",
           "nothing for the job; watch the GPU's remapped rows"),
)  # fmt: skip
# Link replays are routine in small numbers; more than one a minute on average over the job's window is a
# marginal link worth a warning (our threshold: NVIDIA publishes none).
MARGINAL_LINK_PER_S = 1.0 / 60.0
_LINK_KEYS = frozenset(
    {"nvlink_crc_flit_errors", "nvlink_crc_data_errors", "nvlink_replay_errors", "pcie_replay"}
)


def counter_increase(levels: np.ndarray) -> float:
    """How much a cumulative count rose over its finite samples (NaN = no sample): the sum of the rises
    between consecutive samples, where a drop is a reset (driver reload, GPU reset) after which the new
    count is all new, as Prometheus' increase() reads counters."""
    v = np.asarray(levels, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size < 2:
        return 0.0
    d = np.diff(v)
    return float(np.where(d >= 0, d, v[1:]).sum())


def _rise_mask(levels: np.ndarray) -> np.ndarray:
    """Samples at which the count is first seen higher than at the previous finite sample (or reset)."""
    out = np.zeros(levels.shape, dtype=bool)
    idx = np.flatnonzero(np.isfinite(levels))
    if idx.size >= 2:
        v = levels[idx]
        out[idx[1:]] = (np.diff(v) > 0) | ((np.diff(v) < 0) & (v[1:] > 0))
    return out


def aggregate_increase(mean: np.ndarray, count: np.ndarray) -> tuple[float, np.ndarray]:
    """The rise of the GPUs' summed count (mean x count) between consecutive points at which every GPU
    reports (the most GPUs seen): with one GPU short, the sum lacks that GPU's count since driver load and
    a different missing GPU would read as a rise. Drops are ignored (a reset is not seen): a lower bound.
    Returns the rise and the mask of points where it rose."""
    total = np.asarray(mean, dtype=np.float64) * np.asarray(count, dtype=np.float64)
    mask = np.zeros(total.shape, dtype=bool)
    if not np.isfinite(total).any():
        return 0.0, mask
    full = np.nanmax(count)
    idx = np.flatnonzero(np.isfinite(total) & (count == full))
    if idx.size < 2:
        return 0.0, mask
    d = np.diff(total[idx])
    same = np.ones(d.shape, dtype=bool)
    up = same & (d > 0)
    mask[idx[1:][up]] = True
    return float(d[up].sum()), mask


def _may_show(x: np.ndarray, kind: str) -> bool:
    """Whether any GPU's row of a health field can show a rise (`kind` "increase": some row's finite
    samples are not all equal) or a set state (a sample above 0). False lets `_health` skip its per-GPU
    loop, whose rows would all give nothing: the usual healthy job, 13 fields x every GPU (#26 item 2)."""
    finite = np.isfinite(x)
    if kind != "increase":
        return bool((finite & (x > 0)).any())
    if not finite.any():
        return False
    low = np.where(finite, x, np.inf).min(axis=1)
    high = np.where(finite, x, -np.inf).max(axis=1)
    return bool((low < high).any())


@dataclass(slots=True)
class _Seen:
    health: Health
    amount: float  # the increase, or the number of GPUs in the state
    gpus: list[str]
    windows: list[tuple[float, float]]


def _health(f: Features) -> tuple[list[_Seen], list[str]]:
    """Health fields that rose (or were set) in the window; and the missing per-GPU rows, if any."""
    seen: list[_Seen] = []
    missing: list[str] = []
    for h in HEALTH:
        if not f.has(h.key):
            continue
        data = f.gpu_data((h.key,))
        if data is not None:
            x = data.values[h.key]
            amount, gpus, windows = 0.0, [], []
            for i, gpu in enumerate(data.gpus) if _may_show(x, h.kind) else ():
                if h.kind == "increase":
                    inc, mask = counter_increase(x[i]), _rise_mask(x[i])
                else:
                    mask = np.isfinite(x[i]) & (x[i] > 0)
                    inc = 1.0 if mask.any() else 0.0
                if inc > 0:
                    amount += inc
                    gpus.append(f"{gpu}: {round(inc) if h.kind == 'increase' else 'set'}")
                    windows += D.run_windows(D.runs(mask), data.timestamps, data.step)
        else:
            missing.append("per-GPU series")
            mean, count, top = f.stat(h.key, "mean"), f.stat(h.key, "count"), f.stat(h.key, "max")
            gpus = []
            if h.kind == "increase" and mean is not None and count is not None:
                amount, mask = aggregate_increase(mean, count)
            elif h.kind == "state" and h.key in ("row_remap_failure", "row_remap_pending"):
                nonzero = f.stat(h.key, "nonzero")
                mask = np.isfinite(nonzero) & (nonzero > 0) if nonzero is not None else np.zeros(0, bool)
                amount = float(np.nanmax(nonzero)) if mask.any() and nonzero is not None else 0.0
            elif top is not None:  # pages pending retirement: a level
                mask = np.isfinite(top) & (top > 0)
                amount = float(np.nanmax(top)) if mask.any() else 0.0
            else:
                continue
            windows = D.run_windows(D.runs(mask), f.timestamps, f.step) if amount > 0 else []
        if amount > 0:
            seen.append(_Seen(h, amount, gpus, windows))
    return seen, sorted(set(missing))


def _severity(s: _Seen, window_s: float) -> Severity:
    if s.health.key in _LINK_KEYS and window_s > 0 and s.amount / window_s > MARGINAL_LINK_PER_S:
        return Severity.WARNING
    return s.health.severity


def check(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Fire when any GPU of the job reported a non-zero XID code or a DCGM health field rose or was set."""
    xid = _xid(inp, f)
    seen, health_missing = _health(f)
    if xid is None and not seen:
        return None
    window_s = max(f.duration_s, f.step)
    parts: list[str] = []
    evidence: list[Evidence] = []
    windows: list[tuple[float, float]] = []
    severities: list[Severity] = []
    advice: list[str] = []
    impact = 0.0
    missing: list[str] = []
    if xid is not None:
        parts.append(xid.title)
        evidence += xid.evidence
        windows += xid.windows
        severities.append(xid.severity)
        advice.append(RECOMMENDATION)
        impact = xid.impact
        missing += xid.missing_signals
    for s in seen:
        sev = _severity(s, window_s)
        severities.append(sev)
        h = s.health
        n = round(s.amount)
        parts.append(f"{n} {h.what}" if h.kind == "increase" else f"{h.what}: {n}")
        unit = "GPUs" if h.kind == "state" and h.key.startswith("row_remap") else "count"
        label = f"{h.what} in the job's window" if h.kind == "increase" else h.what
        evidence.append(Evidence(label, n, unit))
        if s.gpus:
            evidence.append(Evidence(f"{h.what}, by GPU", "; ".join(s.gpus)))
        windows += s.windows
        advice.append(f"{h.what[0].upper()}{h.what[1:]}: {h.meaning}. {h.action[0].upper()}{h.action[1:]}.")
        if sev is not Severity.INFO:
            affected = len(s.gpus) if s.gpus else 1
            # The affected GPUs' share of the job: their work since the error is suspect or slowed.
            impact = max(impact, affected / max(inp.gpu_count, 1))
    missing = sorted(set(missing) | set(health_missing))
    severity = max(severities, key=lambda v: v.rank)
    coverage = max(f.coverage("xid_errors"), 0.5) if xid is not None else 1.0
    return Finding(
        code=CODE,
        severity=severity,
        confidence=confidence(0.95, missing=missing, coverage=coverage),
        title=("; ".join(parts) + " during the job") if xid is None else "; ".join(parts),
        recommendation=" ".join(advice),
        evidence=evidence,
        windows=D.merge_windows(windows, gap_s=f.step),
        impact=clamp01(impact),
        missing_signals=missing,
        sources=["metrics"],
    )


def _xid(inp: DiagnosisInput, f: Features) -> Finding | None:
    """The XID part: a finding when any GPU reported a non-zero XID code."""
    data = f.gpu_data(("xid_errors",))
    codes: set[int] = set()
    evidence: list[Evidence] = []
    windows: list[tuple[float, float]] = []
    share = 0.0
    missing: list[str] = []
    if data is not None:
        x = data.values["xid_errors"]
        hit = np.isfinite(x) & (x != 0)
        if not hit.any():
            return None
        for i, gpu in enumerate(data.gpus):
            if hit[i].any():
                gpu_codes = sorted({int(c) for c in x[i][hit[i]]})
                codes.update(gpu_codes)
                evidence.append(Evidence(f"{gpu}: XID", ", ".join(map(str, gpu_codes)), "XID code"))
                windows += D.run_windows(D.runs(hit[i]), data.timestamps, data.step)
        share = float(hit.sum()) / max(int(np.isfinite(x).sum()), 1)
    else:
        missing.append("per-GPU series")  # the codes are known, not which GPU reported them
        top, nonzero = f.stat("xid_errors", "max"), f.stat("xid_errors", "nonzero")
        if top is None:
            return None
        hit1 = np.isfinite(top) & (top != 0)
        if not hit1.any():
            return None
        codes.update(int(c) for c in np.unique(top[hit1]))
        evidence.append(Evidence("highest XID code", int(np.nanmax(top[hit1])), "XID code"))
        if nonzero is not None:
            evidence.append(Evidence("GPUs with an XID at once, max", int(np.nanmax(nonzero)), "count"))
        windows = D.run_windows(D.runs(hit1), f.timestamps, f.step)
        share = float(hit1.mean()) / max(inp.gpu_count, 1)
    seconds = sum(b - a for a, b in D.merge_windows(windows))
    evidence.append(Evidence("time with an XID reported", round(seconds), "s"))
    hardware = sorted(c for c in codes if c in T.XID_HARDWARE)
    return Finding(
        code=CODE,
        severity=Severity.CRITICAL if hardware else Severity.WARNING,
        confidence=confidence(0.95, missing=missing, coverage=max(f.coverage("xid_errors"), 0.5)),
        title=f"XID error{'s' if len(codes) > 1 else ''} {', '.join(map(str, sorted(codes)))} during the job"
        + (" (hardware)" if hardware else ""),
        recommendation=RECOMMENDATION,
        evidence=evidence,
        windows=D.merge_windows(windows, gap_s=f.step),
        impact=clamp01(share),
        missing_signals=missing,
        sources=["metrics"],
    )
