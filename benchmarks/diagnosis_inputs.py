"""Turn simulator output into what ingestion would give the diagnosis, without Prometheus (pure numpy).

`signals_from_sim` reproduces what `jobs.metrics.signal_queries.fetch_job_signals` returns when the
simulated job was backfilled into Prometheus and read back: raw exporter values scaled to the registry's
units, counters turned into rate(x[5m]), Prometheus's 5-minute lookback (a lost scrape reads as the
previous value, longer holes as no data), cross-GPU mean/min/max/count, throttle-reason shares, XID
max/non-zero count and the per-GPU matrices. `input_from_sim` adds the KPIs (MFU from the simulated
throughput, cost and waste from a price) as `DiagnosisInput`. Used by the unit tests, the
diagnosis harness (benchmarks.diagnosis_harness, the `evaluate_diagnosis` command) and for quick experiments;
not production code, so it lives outside the jobs package.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from jobs.diagnosis.base import ArtifactAnalysis, DiagnosisInput
from jobs.evaluation.catalog import match_gpu_name
from jobs.evaluation.flops import utilisation
from jobs.metrics.signal_queries import missing_reason
from jobs.metrics.signals import (
    COUNT,
    MAX,
    MEAN,
    MIN,
    NONZERO,
    SIGNALS,
    THROTTLE_BITS,
    GpuKey,
    JobSignals,
    Reading,
    SignalSeries,
)
from jobs.simulate import SimResult

LOOKBACK_S = 300.0  # Prometheus's default lookback delta
RATE_WINDOW_S = 300.0
DEFAULT_PRICE_USD_PER_GPU_HOUR = 6.88


def _lookback(raw: np.ndarray, step_s: float) -> np.ndarray:
    # Each evaluation at t sees the latest sample in (t - 5 min, t]: forward-fill at most that far.
    limit = int(np.ceil(LOOKBACK_S / step_s)) - 1
    out = raw.copy()
    last = np.full(raw.shape[0], np.nan)
    age = np.full(raw.shape[0], np.inf)
    for t in range(raw.shape[1]):
        col = raw[:, t]
        have = np.isfinite(col)
        last = np.where(have, col, last)
        age = np.where(have, 0, age + 1)
        out[:, t] = np.where(age <= limit, last, np.nan)
    return out


def _rate(raw: np.ndarray, ts: np.ndarray) -> np.ndarray:
    # rate(x[5m]) from the samples in (t - 5 min, t]: (last - first) / (t_last - t_first), no extrapolation.
    g, n = raw.shape
    out = np.full((g, n), np.nan)
    for t in range(n):
        lo = int(np.searchsorted(ts, ts[t] - RATE_WINDOW_S, side="right"))
        win = raw[:, lo : t + 1]
        tw = ts[lo : t + 1]
        for i in range(g):
            ok = np.isfinite(win[i])
            if ok.sum() >= 2:
                v, tt = win[i][ok], tw[ok]
                out[i, t] = (v[-1] - v[0]) / (tt[-1] - tt[0]) if tt[-1] > tt[0] else np.nan
    return out


def _stats(values: np.ndarray, reading: Reading) -> dict[str, np.ndarray]:
    have = np.isfinite(values)
    count = have.sum(axis=0).astype(np.float64)
    none = count == 0
    with np.errstate(invalid="ignore"):
        if reading is Reading.CODE:
            mx = np.where(none, np.nan, np.nanmax(np.where(have, values, -np.inf), axis=0))
            nz = (have & (values != 0)).sum(axis=0).astype(np.float64)
            return {MAX: mx, NONZERO: nz, COUNT: np.where(none, np.nan, count)}
        if reading is Reading.BITMASK:
            out: dict[str, np.ndarray] = {}
            for name, bit in THROTTLE_BITS.items():
                bits = np.where(have, np.floor(np.nan_to_num(values) / bit) % 2, 0.0)
                out[name] = np.where(none, np.nan, bits.sum(axis=0) / np.maximum(count, 1))
            out[COUNT] = np.where(none, np.nan, count)
            return out
        total = np.where(have, values, 0.0).sum(axis=0)
        return {
            MEAN: np.where(none, np.nan, total / np.maximum(count, 1)),
            MIN: np.where(none, np.nan, np.nanmin(np.where(have, values, np.inf), axis=0)),
            MAX: np.where(none, np.nan, np.nanmax(np.where(have, values, -np.inf), axis=0)),
            COUNT: np.where(none, np.nan, count),
        }


def signals_from_sim(
    res: SimResult, *, per_gpu: bool = True, keys: Iterable[str] | None = None
) -> JobSignals:
    """The JobSignals ingestion would archive for a simulated job (see the module docstring)."""
    ts = np.asarray(res.timestamps, dtype=np.float64)
    step = float(res.spec.step_s)
    out = JobSignals(float(ts[0]), float(ts[-1]), step, ts)
    gpus = tuple(GpuKey(g.hostname, str(g.index)) for g in res.gpus)
    for key in keys if keys is not None else SIGNALS:
        sig = SIGNALS[key]
        raw = res.fields.get(key)
        if raw is None or not np.isfinite(raw).any():
            out.missing[key] = missing_reason(sig, False)
            continue
        if res.sample_offsets is not None:
            # Scraped at an offset after each grid time: an instant query at the grid time sees the
            # previous scrape (query_range picks the latest sample at or before each step).
            raw = np.concatenate([np.full((raw.shape[0], 1), np.nan), raw[:, :-1]], axis=1)
        if sig.reading in (Reading.RATE, Reading.ENERGY, Reading.COUNTER):
            values = _rate(raw, ts) * sig.scale
        elif sig.reading in (Reading.CODE, Reading.BITMASK):
            values = _lookback(raw, step)
        else:
            values = _lookback(raw, step) * sig.scale
        stats = _stats(values, sig.reading)
        series = SignalSeries(key, sig.unit, ts, stats)
        if per_gpu:
            series.gpus, series.gpu_timestamps, series.per_gpu = gpus, ts, values
        out.signals[key] = series
    tps = res.throughput.tokens_per_s
    out.signals["tokens_per_second"] = SignalSeries("tokens_per_second", "tokens/s", ts, {MEAN: tps.copy()})
    mfu = utilisation(res.throughput.flops_per_token, tps, len(res.gpus) * res.throughput.peak_flops_per_gpu)
    out.signals["mfu"] = SignalSeries("mfu", "ratio", ts, {MEAN: mfu})
    return out


def blank_profiling(res: SimResult, start_frac: float, end_frac: float) -> SimResult:
    """The same job with every profiling field blank over a stretch (an Nsight capture); util unchanged."""
    n = res.timestamps.size
    lo, hi = int(start_frac * n), int(np.ceil(end_frac * n))
    for key, arr in res.fields.items():
        if key in SIGNALS and SIGNALS[key].field.startswith("DCGM_FI_PROF_"):
            arr[:, lo:hi] = np.nan
    return res


def _known(value: float | None) -> float | None:
    return None if value is None else float(value)


def input_from_sim(
    res: SimResult,
    *,
    signals: JobSignals | None = None,
    reference_mfu: float = 0.45,
    price: float = DEFAULT_PRICE_USD_PER_GPU_HOUR,
    baseline: dict[str, dict[str, Any]] | None = None,
    artifacts: Iterable[ArtifactAnalysis] = (),
    dtype: str = "bf16",
    catalog: bool = True,
    kind: str = "training",
    idle_share: float | None = None,
) -> DiagnosisInput:
    """A DiagnosisInput for a simulated job: KPIs from the simulated throughput and a flat price."""
    sigs = signals if signals is not None else signals_from_sim(res)
    n = len(res.gpus)
    cost = n * price * 24.0
    mfu = res.throughput.mfu
    # The GPU catalog row the exporter's modelName matches, as ingestion resolves it (findings.py reads the
    # same fields from the database row seeded from it); `catalog=False` plays an unknown GPU model.
    spec = match_gpu_name(res.spec.gpu_model) if catalog else None
    return DiagnosisInput(
        signals=sigs,
        gpu_count=n,
        dtype=dtype,
        mfu=mfu,
        reference_mfu=reference_mfu,
        tokens_per_second=float(np.mean(res.throughput.tokens_per_s)),
        cost_per_day_usd=cost,
        waste_per_day_usd=cost * max(0.0, 1.0 - mfu / reference_mfu),
        gpu_memory_mib=_known(spec.memory_mib if spec else None),
        max_clock_mhz=_known(spec.max_clock_mhz if spec else None),
        tdp_w=_known(spec.tdp_w if spec else None),
        baseline=baseline,
        artifacts=tuple(artifacts),
        kind=kind,
        idle_share=idle_share,
        sample_interval_s=float(res.spec.step_s),  # the scrape interval (the grid step of the signals)
    )
