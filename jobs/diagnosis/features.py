"""Shared, cached views of a job's signals for the rules: busy masks, robust levels, aligned per-GPU data.

Everything tolerates missing signals (None), missing samples (NaN) and profiler captures (profiling
fields blank while GPU_UTIL is up: excluded from levels, never read as idle).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from jobs.diagnosis import detectors as D
from jobs.diagnosis import regimes as R
from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import DiagnosisInput
from jobs.metrics.signals import SIGNALS, JobSignals

PROFILING_KEYS: tuple[str, ...] = tuple(k for k, s in SIGNALS.items() if s.field.startswith("DCGM_FI_PROF_"))

#: The GPU signals whose per-GPU rows the rules read (`Features.gpu_data`, `level`, `per_gpu_level`): the
#: utilisation, the levels the rules compare, the straggler's clocks and throttle reasons, the XID and
#: health fields (jobs.diagnosis.rules.gpu_errors.HEALTH). The diagnosis loads per-GPU rows of these only
#: (jobs.pipeline.findings: a fifth of a default exporter's per-GPU archive is fb_free, mem_clock,
#: mem_copy_util, NVLink bandwidth and energy, which no rule reads per GPU; #26 item 2). `gpu_data` refuses
#: any other GPU signal, so a rule that needs one fails its tests until it is added here.
PER_GPU_KEYS: frozenset[str] = frozenset(
    {
        "gpu_util",
        "gr_engine_active",
        "sm_active",
        "sm_occupancy",
        "tensor_active",
        "dram_active",
        "fp32_active",
        "sm_clock",
        "clock_throttle_reasons",
        "fb_used",
        "gpu_temp",
        "memory_temp",
        "power_usage",
        "pcie_rx_bytes",
        "pcie_tx_bytes",
        "xid_errors",
        "ecc_sbe_volatile",
        "ecc_dbe_volatile",
        "retired_pending",
        "retired_dbe",
        "correctable_remapped_rows",
        "uncorrectable_remapped_rows",
        "row_remap_failure",
        "row_remap_pending",
        "nvlink_crc_flit_errors",
        "nvlink_crc_data_errors",
        "nvlink_replay_errors",
        "nvlink_recovery_errors",
        "pcie_replay",
    }
)


@dataclass(frozen=True, slots=True)
class GpuData:
    """Per-GPU values of one or more signals on one grid: `values[key]` is (len(gpus), len(timestamps))."""

    gpus: tuple[str, ...]
    hosts: tuple[str, ...]
    timestamps: np.ndarray
    step: float
    values: dict[str, np.ndarray]


class Features:
    """Lazily computed features of one `DiagnosisInput`; rules share one instance per diagnosis."""

    def __init__(self, inp: DiagnosisInput) -> None:
        self.inp = inp
        self.sigs: JobSignals | None = inp.signals
        self._gpu_cache: dict[tuple[str, ...], GpuData | None] = {}
        self._level_cache: dict[tuple[str, float, bool], float | None] = {}
        self._per_gpu_cache: dict[tuple[str, float], tuple[GpuData, np.ndarray] | None] = {}
        self._matrix_cache: dict[tuple[str, tuple[str, ...], bytes], np.ndarray] = {}
        self._order_cache: dict[
            tuple[int, ...], tuple[tuple[tuple[object, ...], ...], list[str], dict[str, int]]
        ] = {}

    # ---------------------------------------------------------------------------------- aggregates

    @property
    def step(self) -> float:
        """Seconds between aggregate samples (30 when there are no signals)."""
        return float(self.sigs.step) if self.sigs is not None else 30.0

    @property
    def timestamps(self) -> np.ndarray:
        """The aggregate time grid (unix seconds)."""
        return self.sigs.timestamps if self.sigs is not None else np.zeros(0)

    def has(self, key: str) -> bool:
        """True when the signal has data for this job."""
        return self.sigs is not None and self.sigs.get(key) is not None

    def stat(self, key: str, stat: str = "mean") -> np.ndarray | None:
        """An aggregate series (mean/min/max/count or a throttle-reason share), NaN inside captures."""
        if self.sigs is None:
            return None
        series = self.sigs.get(key)
        if series is None or stat not in series.stats:
            return None
        values = np.asarray(series.stats[stat], dtype=np.float64)
        if key in PROFILING_KEYS and self.capture_mask.any():
            values = np.where(self.capture_mask, np.nan, values)
        return values

    def mean(self, key: str) -> np.ndarray | None:
        """Cross-GPU mean series of a signal."""
        return self.stat(key, "mean")

    def missing(self, keys: tuple[str, ...] | list[str]) -> list[str]:
        """The keys among `keys` with no data for this job (in the given order)."""
        return [k for k in keys if not self.has(k)]

    @cached_property
    def util_key(self) -> str | None:
        """Which signal stands for "a kernel is running": GPU_UTIL, else GR_ENGINE_ACTIVE."""
        for key in ("gpu_util", "gr_engine_active"):
            if self.has(key):
                return key
        return None

    @cached_property
    def util(self) -> np.ndarray | None:
        """Cross-GPU mean utilisation (ratio) on the aggregate grid."""
        if self.util_key is None or self.sigs is None:
            return None
        series = self.sigs.get(self.util_key)
        return None if series is None or series.mean is None else np.asarray(series.mean, dtype=np.float64)

    @cached_property
    def busy(self) -> np.ndarray:
        """Samples where the job's mean utilisation reads busy (all True when utilisation is unknown)."""
        if self.util is None:
            return np.ones(self.timestamps.size, dtype=bool)
        return np.isfinite(self.util) & (self.util >= T.BUSY_UTIL_MIN)

    @cached_property
    def capture_runs(self) -> list[D.Run]:
        """Stretches where every profiling field is blank while utilisation is up (profiler captures)."""
        if self.util is None or self.sigs is None:
            return []
        prof = [s.mean for k in PROFILING_KEYS if (s := self.sigs.get(k)) is not None and s.mean is not None]
        return D.blank_stretches(prof, self.util)

    @cached_property
    def capture_mask(self) -> np.ndarray:
        """Boolean mask of the capture stretches on the aggregate grid."""
        mask = np.zeros(self.timestamps.size, dtype=bool)
        for a, b in self.capture_runs:
            mask[a:b] = True
        return mask

    def level(self, key: str, q: float = 0.5, *, busy_only: bool = True) -> float | None:
        """Robust level of a signal over the job: the q-quantile over busy GPU-samples.

        Uses per-GPU cells (a GPU's sample counts when that GPU is busy) when both the signal and the
        utilisation have per-GPU data, so idle GPUs and input stalls do not drag "SM active while busy"
        down; otherwise the cross-GPU mean over busy samples.
        """
        cache_key = (key, q, busy_only)
        if cache_key in self._level_cache:
            return self._level_cache[cache_key]
        value: float | None = None
        data = self.gpu_data((key, self.util_key)) if busy_only and self.util_key else None
        if data is not None and self.util_key is not None:
            v, u = data.values[key], data.values[self.util_key]
            cells = v[np.isfinite(v) & np.isfinite(u) & (u >= T.BUSY_UTIL_MIN)]
            if cells.size >= 5:
                value = float(np.quantile(cells, q))
        if value is None:
            series = self.mean(key)
            if series is not None:
                sel = series[self.busy] if busy_only else series
                value = D.nanquantile(sel, q)
        self._level_cache[cache_key] = value
        return value

    def coverage(self, key: str) -> float:
        """Share of the job's samples where the signal has a value (captures excluded from the count)."""
        series = self.stat(key, "mean") if key != "xid_errors" else self.stat(key, "max")
        if series is None:
            return 0.0
        outside = ~self.capture_mask
        return D.coverage(series[outside]) if outside.any() else 0.0

    # ------------------------------------------------------------------------------------- per GPU

    def gpu_data(self, keys: tuple[str | None, ...] | list[str]) -> GpuData | None:
        """Per-GPU matrices of several signals on one grid and one GPU order; None when any is absent."""
        wanted = tuple(k for k in keys if k)
        if wanted in self._gpu_cache:
            return self._gpu_cache[wanted]
        unlisted = [k for k in wanted if k in SIGNALS and k not in PER_GPU_KEYS]
        if unlisted:
            raise ValueError(
                f"per-GPU rows of {unlisted} are not loaded for the diagnosis: add to PER_GPU_KEYS"
            )
        result = self._align(wanted)
        self._gpu_cache[wanted] = result
        return result

    def _align(self, keys: tuple[str, ...]) -> GpuData | None:
        if self.sigs is None or not keys:
            return None
        series = [self.sigs.get(k) for k in keys]
        if any(s is None or s.per_gpu is None or s.gpu_timestamps is None or not s.gpus for s in series):
            return None
        first = series[0]
        assert first is not None and first.gpu_timestamps is not None
        ts = np.asarray(first.gpu_timestamps, dtype=np.float64)
        step = float(ts[1] - ts[0]) if ts.size > 1 else self.step
        names, row_of = self._gpu_order_of(tuple(s.gpus for s in series if s is not None))
        values: dict[str, np.ndarray] = {}
        grid = (tuple(names), ts.tobytes())
        for key, s in zip(keys, series, strict=True):
            assert s is not None and s.per_gpu is not None and s.gpu_timestamps is not None
            # One signal's matrix on one GPU order and grid is the same whichever signals it is aligned
            # with: built once per diagnosis and shared (read-only) by every combination (#26 item 2).
            out = self._matrix_cache.get((key, *grid))
            if out is None:
                out = np.full((len(names), ts.size), np.nan)
                cols = np.rint((np.asarray(s.gpu_timestamps) - ts[0]) / step).astype(np.int64)
                ok = (cols >= 0) & (cols < ts.size)
                matrix = np.asarray(s.per_gpu, dtype=np.float64)
                if len(s.gpus) != matrix.shape[0]:
                    raise ValueError(f"{key}: {len(s.gpus)} GPUs named for {matrix.shape[0]} per-GPU rows")
                rows = np.array([row_of[str(g)] for g in s.gpus], dtype=np.intp)
                out[np.ix_(rows, cols[ok])] = matrix[:, ok]
                if key in PROFILING_KEYS and self.capture_runs:
                    out[:, self._capture_cols(ts)] = np.nan
                out.flags.writeable = False
                self._matrix_cache[(key, *grid)] = out
            values[key] = out
        hosts = tuple(n.rpartition("/")[0] for n in names)
        return GpuData(tuple(names), hosts, ts, step, values)

    def _gpu_order_of(self, gpu_lists: tuple[tuple[object, ...], ...]) -> tuple[list[str], dict[str, int]]:
        """The union of the series' GPUs in host/index order and each one's row: the same few lists are
        aligned a dozen times a diagnosis, so they are sorted once (#26 item 2)."""
        # Keyed by the lists' identities (GpuKey's dataclass hash and == cost more than the sort); the
        # entry holds the lists, so no id is reused while it is cached.
        key = tuple(id(gpus) for gpus in gpu_lists)
        got = self._order_cache.get(key)
        if got is None:
            names = sorted({str(g) for gpus in gpu_lists for g in gpus}, key=_gpu_order)
            got = (gpu_lists, names, {n: i for i, n in enumerate(names)})
            self._order_cache[key] = got
        return got[1], got[2]

    def _capture_cols(self, ts: np.ndarray) -> np.ndarray:
        mask = np.zeros(ts.size, dtype=bool)
        for start, end in D.run_windows(self.capture_runs, self.timestamps, self.step):
            mask |= (ts >= start) & (ts < end)
        return mask

    def per_gpu_level(self, key: str, q: float = 0.5) -> tuple[GpuData, np.ndarray] | None:
        """Each GPU's q-quantile of `key` over its own busy samples (NaN for a GPU never busy).

        Cached per (key, q): straggler asks for the utilisation's levels once per metric and throttling for
        the clock's again (#26 item 2). The levels array is shared: callers must not write to it."""
        cache_key = (key, q)
        if cache_key in self._per_gpu_cache:
            return self._per_gpu_cache[cache_key]
        result = self._per_gpu_level(key, q)
        self._per_gpu_cache[cache_key] = result
        return result

    def _per_gpu_level(self, key: str, q: float) -> tuple[GpuData, np.ndarray] | None:
        data = self.gpu_data((key, self.util_key) if self.util_key else (key,))
        if data is None:
            return None
        v = data.values[key]
        busy = (
            np.isfinite(data.values[self.util_key]) & (data.values[self.util_key] >= T.BUSY_UTIL_MIN)
            if self.util_key
            else np.ones_like(v, dtype=bool)
        )
        masked = np.where(busy & np.isfinite(v), v, np.nan)
        levels = D.row_nanquantiles(masked, q)
        levels.flags.writeable = False  # shared through the cache
        return data, levels

    # --------------------------------------------------------------------------------- resolution

    @cached_property
    def resolution(self) -> R.Resolution:
        """The signals' effective resolution (sample interval, step time when known)."""
        return R.resolution(self.inp, self.step)

    @cached_property
    def looks(self) -> R.Looks | None:
        """The four looks as job-level levels and ratios (the unresolved regime's evidence)."""
        if self.util_key is None:
            return None
        data = self.gpu_data((self.util_key,))
        util = data.values[self.util_key] if data is not None else self.util
        average: np.ndarray | None = None
        if self.util_key == "gpu_util" and self.has("gr_engine_active"):
            both = self.gpu_data(("gpu_util", "gr_engine_active"))
            if both is not None and data is not None and both.gpus == data.gpus:
                average = both.values["gr_engine_active"]
            elif data is None:
                average = self.mean("gr_engine_active")
        nvl = self.mean("nvlink_tx_bytes")
        if nvl is None and (total := self.mean("nvlink_bandwidth_total")) is not None:
            nvl = total / 2.0  # TX + RX over all links
        rx, tx = self.mean("pcie_rx_bytes"), self.mean("pcie_tx_bytes")
        pcie = None
        if rx is not None or tx is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                pcie = np.nanmax(np.vstack([s for s in (rx, tx) if s is not None]), axis=0)
        lk = R.looks(
            util,
            {
                "sm_active": self.mean("sm_active"),
                "tensor_active": self.mean("tensor_active"),
                "dram_active": self.mean("dram_active"),
                "nvlink": nvl,
                "pcie": pcie,
            },
            busy_average=average,
            long_idle=max(
                int(np.ceil(T.IDLE_MIN_STRETCH_S / (data.step if data is not None else self.step))), 2
            ),
        )
        if lk is not None and self.util_key != "gpu_util":
            # GR_ENGINE_ACTIVE is a collect-interval average, not a point sample: its spread says nothing.
            lk = R.Looks(lk.util_mean, None, None, None, lk.samples, lk.sm, lk.tensor, lk.dram,
                         lk.nvlink_bps, lk.pcie_bps)  # fmt: skip
        return lk

    @cached_property
    def samples_per_gpu(self) -> int:
        """Utilisation samples per GPU (median over GPUs; the aggregate's count without per-GPU data)."""
        if self.util_key is None:
            return 0
        data = self.gpu_data((self.util_key,))
        if data is not None:
            return int(np.median(np.isfinite(data.values[self.util_key]).sum(axis=1)))
        return int(np.isfinite(self.util).sum()) if self.util is not None else 0

    # ----------------------------------------------------------------------------------- job facts

    @cached_property
    def duration_s(self) -> float:
        """Length of the signal window in seconds (0 without signals)."""
        if self.sigs is None or self.timestamps.size == 0:
            return 0.0
        return float(self.timestamps[-1] - self.timestamps[0] + self.step)

    @property
    def whole_window(self) -> list[tuple[float, float]]:
        """The job's whole signal window as one [start, end] pair (empty without signals)."""
        if self.sigs is None or self.timestamps.size == 0:
            return []
        return [(float(self.timestamps[0]), float(self.timestamps[-1] + self.step))]

    def windows_where(self, mask: np.ndarray, *, min_len: int = 1) -> list[tuple[float, float]]:
        """Windows (unix) of the runs of `mask` on the aggregate grid, at least `min_len` samples long."""
        rs = [r for r in D.runs(mask) if r[1] - r[0] >= min_len]
        return D.merge_windows(D.run_windows(rs, self.timestamps, self.step), gap_s=2 * self.step)


def _gpu_order(name: str) -> tuple[str, int, str]:
    host, _, gpu = name.rpartition("/")
    return host, int(gpu) if gpu.isdigit() else -1, gpu
