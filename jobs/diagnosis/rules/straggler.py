"""straggler: one GPU (or one node) persistently slower than its peers; in synchronous training all wait.

Per GPU, the median over its busy samples of SM clock, SM active and tensor active is compared with its
peers by a robust z-score (median/MAD with a spread floor). Clocks barely differ between healthy GPUs, so a
small clock deficit counts; activity must be well below. Idle GPUs are left to idle_gpus.

Resolution: per-GPU levels over the whole job, valid in both regimes; a rank that is slow only for a
few steps, or slow by less than the peers' spread, is not seen; a straggler inside each step (every rank
waits for a different one) looks like communication_wait.

Traces of several ranks of one capture (`jobs.diagnosis.cross_rank`): the rank with the least NCCL kernel
time per step arrived last at the collectives and the others waited for it; named when the spread of NCCL
time is a real share of the step. Cannot see from traces: whether the same rank is late in every step
(per-rank totals over the captured steps), or why it is late beyond its compute time per step.
"""

from __future__ import annotations

import statistics
import warnings

import numpy as np

from jobs.diagnosis import artifacts as A
from jobs.diagnosis import cross_rank as X
from jobs.diagnosis import detectors as D
from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import DiagnosisInput, Evidence, Finding, Severity, clamp01, confidence
from jobs.diagnosis.features import Features
from jobs.diagnosis.rules.common import busy_share
from jobs.metrics.signals import THROTTLE_BITS

CODE = "straggler"
RECOMMENDATION = (
    "Everyone waits for the slowest rank at each collective. Check the named GPU/node: clocks and throttle "
    "reasons (nvidia-smi -q -d PERFORMANCE), temperature and cooling, ECC/XID errors, PCIe link width and "
    "NVLink status; drain the node and rerun, or exclude it from the allocation."
)
# (signal, minimum relative deficit) in order of trust.
_METRICS = (
    ("sm_clock", T.STRAGGLER_MIN_CLOCK_DEFICIT),
    ("sm_active", T.STRAGGLER_MIN_DEFICIT),
    ("tensor_active", T.STRAGGLER_MIN_DEFICIT),
)


def check(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Fire when some GPUs' robust z-scores and deficits mark them persistently below their peers."""
    candidates: dict[str, dict[str, tuple[float, float, float]]] = {}
    used: list[str] = []
    for key, min_deficit in _METRICS:
        lv = f.per_gpu_level(key)
        if lv is None:
            continue
        data, levels = lv
        active = _busy_gpus(f, data.gpus)
        vals = np.where(active, levels, np.nan)
        if np.isfinite(vals).sum() < T.STRAGGLER_MIN_GPUS:
            continue
        used.append(key)
        rz = D.robust_z(vals)
        if rz is None or rz.median <= 0:
            continue
        for i, gpu in enumerate(data.gpus):
            z, deficit = rz.z[i], 1.0 - vals[i] / rz.median
            if (
                np.isfinite(z)
                and z <= T.STRAGGLER_Z
                and deficit >= min_deficit
                and _persistent(data.values[key][i], np.delete(data.values[key], i, axis=0))
            ):
                candidates.setdefault(gpu, {})[key] = (float(vals[i]), rz.median, float(z))
    activity = [k for k in used if k != "sm_clock"]
    flagged = {g: hits for g, hits in candidates.items() if _supported(f, g, hits, activity)}
    node = _node_straggler(f)
    trace = X.imbalances(inp)
    if not flagged and node is None:
        return _trace_finding(trace) if trace else None
    evidence: list[Evidence] = []
    worst = 0.0
    strong = False
    for gpu, hits in sorted(flagged.items()):
        for key, (value, median, z) in hits.items():
            unit = "MHz" if key == "sm_clock" else "%"
            scale = 1.0 if key == "sm_clock" else 100.0
            evidence.append(
                Evidence(
                    f"{gpu}: {key} (peers' median {round(median * scale, 1)} {unit})",
                    round(value * scale, 1),
                    unit,
                )
            )
            evidence.append(Evidence(f"{gpu}: {key} robust z-score", round(z, 1), "z"))
            worst = max(worst, 1.0 - value / median)
        strong = strong or "sm_clock" in hits or len(hits) >= 2
        reasons = _reasons(f, gpu)
        if reasons:
            evidence.append(Evidence(f"{gpu}: clock event reasons", reasons))
            strong = True
    if node is not None:
        host, deficit, key = node
        evidence.append(Evidence(f"node {host}: {key} below the other nodes", round(100 * deficit, 1), "%"))
        worst, strong = max(worst, deficit), True
    names = sorted(flagged) if flagged else []
    missing = f.missing(["sm_active", "clock_throttle_reasons"])
    base = 0.85 if strong else 0.55
    sources = ["metrics"]
    if trace and trace[0].late:
        # The traces name who the others wait for: the same cause seen in the collectives.
        evidence += trace[0].evidence()
        sources += sorted({r.source for r in trace[0].ranks})
        base = min(base + 0.05, 0.95)
    label = f"node {node[0]}" if node is not None and not names else ", ".join(names[:4])
    more = f" and {len(names) - 4} more" if len(names) > 4 else ""
    return Finding(
        code=CODE,
        severity=Severity.WARNING if strong else Severity.INFO,
        confidence=confidence(base, missing=missing, coverage=f.coverage(used[0]) if used else 1.0),
        title=f"Straggler: {label}{more} persistently slower than the other GPUs",
        recommendation=RECOMMENDATION,
        evidence=evidence,
        windows=f.whole_window,
        impact=busy_share(f) * clamp01(worst),
        missing_signals=missing,
        sources=sources,
    )


def _trace_finding(found: list[X.Imbalance]) -> Finding:
    """The finding from the ranks' traces alone: who the others wait for, with each rank's numbers."""
    worst = found[0]
    late = worst.late
    step = worst.step_ms
    if late:
        one = len(late) == 1
        title = (
            f"Straggler: {worst.late_names} {'arrives' if one else 'arrive'} last at the collectives; the "
            f"other ranks wait for {'it' if one else 'them'} {worst.wait_ms:.3g} ms per step on average "
            f"({100 * worst.wait_share:.1f} % of the {step:.3g} ms step)"
        )
    else:
        title = (
            f"Ranks imbalanced: {X.rank_names(worst.longest)} wait{'s' if len(worst.longest) == 1 else ''} "
            f"{worst.most_ms:.3g} ms per step in NCCL while the others wait {worst.least_ms:.3g} ms: "
            "most ranks are slower than these"
        )
    evidence = worst.evidence()
    if late:
        mine = [r.compute_ms for r in late if r.compute_ms is not None]
        peers = [r.compute_ms for r in worst.ranks if r not in late and r.compute_ms is not None]
        if mine and peers:
            # More compute on the late rank: load imbalance (uneven shards); the same compute: a host-side
            # delay or a slower GPU/node before the collective.
            evidence.append(
                Evidence(
                    "late rank(s): compute per step vs the other ranks' median",
                    round(max(mine) / statistics.median(peers), 2),
                    "x",
                )
            )
    for other in found[1:]:
        evidence.append(Evidence("another capture: late ranks", other.late_names or "none named"))
    warn = bool(late) and worst.wait_share >= X.WARN_WAIT_SHARE
    return Finding(
        code=CODE,
        severity=Severity.WARNING if warn else Severity.INFO,
        # Per-rank totals of the captured steps: a one-off late step looks the same as a persistent one.
        confidence=confidence(0.75 if min(r.steps for r in worst.ranks) >= 3 else 0.65),
        title=title,
        recommendation=RECOMMENDATION
        + " In the traces, compare the late rank's step with the others' before the collective: more "
        "compute there means uneven work (shard sizes, sequence lengths, embedding tables); the same "
        "compute means a host-side delay (data loading, Python) or a slower GPU.",
        evidence=evidence,
        windows=A.merge_windows(worst.windows),
        impact=clamp01(worst.wait_share),
        sources=sorted({r.source for r in worst.ranks}),
    )


def _supported(
    f: Features, gpu: str, hits: dict[str, tuple[float, float, float]], activity: list[str]
) -> bool:
    """A clock deficit or throttle reason backs any activity deficit; otherwise every activity signal must
    be far below (STRAGGLER_ACTIVITY_ONLY_DEFICIT)."""
    if "sm_clock" in hits or _reasons(f, gpu):
        return True
    if not activity or any(k not in hits for k in activity):
        return False
    return all(1.0 - v / m >= T.STRAGGLER_ACTIVITY_ONLY_DEFICIT for v, m, _ in hits.values())


def _busy_gpus(f: Features, gpus: tuple[str, ...]) -> np.ndarray:
    """GPUs busy in most of their samples (an idle GPU is idle_gpus' business, not a straggler)."""
    if f.util_key is None:
        return np.ones(len(gpus), dtype=bool)
    lv = f.per_gpu_level(f.util_key)
    if lv is None:
        return np.ones(len(gpus), dtype=bool)
    data, _ = lv
    u = data.values[f.util_key]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        share = np.nanmean(np.where(np.isfinite(u), u >= T.BUSY_UTIL_MIN, np.nan), axis=1)
    order = {g: i for i, g in enumerate(data.gpus)}
    return np.array([order.get(g) is not None and share[order[g]] >= 0.5 for g in gpus])


def _persistent(row: np.ndarray, peers: np.ndarray) -> bool:
    """The GPU is below its peers' median in at least STRAGGLER_PERSISTENCE of the samples both have."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns are fine: masked below
        med = np.nanmedian(peers, axis=0)
    ok = np.isfinite(row) & np.isfinite(med)
    return bool(ok.sum() >= 3 and (row[ok] < med[ok]).mean() >= T.STRAGGLER_PERSISTENCE)


def _node_straggler(f: Features) -> tuple[str, float, str] | None:
    """A host whose GPUs are all below every other host's GPUs, by NODE_MIN_DEFICIT of the others' median
    (STRAGGLER_MIN_CLOCK_DEFICIT for clocks), and below them in most samples (persistently)."""
    for key, min_deficit in (("sm_clock", T.STRAGGLER_MIN_CLOCK_DEFICIT), ("sm_active", T.NODE_MIN_DEFICIT)):
        lv = f.per_gpu_level(key)
        if lv is None:
            continue
        data, levels = lv
        hosts = sorted(set(data.hosts))
        if len(hosts) < 2:
            return None
        host_arr = np.array(data.hosts)
        for host in hosts:
            mine_rows, other_rows = host_arr == host, host_arr != host
            mine, others = levels[mine_rows], levels[other_rows]
            mine, others = mine[np.isfinite(mine)], others[np.isfinite(others)]
            if mine.size < 2 or others.size < 2:
                continue
            ref = float(np.median(others))
            deficit = 1.0 - float(np.median(mine)) / ref if ref > 0 else 0.0
            if deficit < min_deficit or float(mine.max()) >= float(others.min()):
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                own = np.nanmedian(data.values[key][mine_rows], axis=0)
            if _persistent(own, data.values[key][other_rows]):
                return host, deficit, key
    return None


def _reasons(f: Features, gpu: str) -> str:
    """Throttle reason bits this GPU reported in >= 30 % of its samples while most peers did not."""
    data = f.gpu_data(("clock_throttle_reasons",))
    if data is None or gpu not in data.gpus:
        return ""
    m = data.values["clock_throttle_reasons"]
    seen = np.isfinite(m)
    codes = np.where(seen, m, 0).astype(np.int64)
    me = data.gpus.index(gpu)
    out = []
    for name, bit in THROTTLE_BITS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            share = np.nanmean(np.where(seen, (codes & bit) != 0, np.nan), axis=1)
        peers = np.delete(share, me)
        if share[me] >= 0.3 and (peers.size == 0 or float(np.nanmedian(peers)) < 0.3):
            out.append(name)
    return ", ".join(out)
