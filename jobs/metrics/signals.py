"""Registry of the DCGM fields the product reads, the readiness panel's view of it, and the per-job result
(`JobSignals`: aggregate series per signal, optional per-GPU rows). The PromQL that reads these fields and
one job's read (`fetch_job_signals`) are in jobs.metrics.signal_queries.

Pure: no Django and no HTTP.

Per-process (per-pod) utilisation on a time-sliced GPU is not exported by any standard exporter, so the
registry has none: dcgm-exporter "does not report process utilization but gpu and pod utilization"
(maintainer, NVIDIA/dcgm-exporter #127); with `--kubernetes-virtual-gpus` it copies the device's values to
every pod sharing the GPU (#587, #642: NVML's utilisation is per device), and the proposed per-pod metric
from nvmlDeviceGetProcessUtilization (`dcgm_fi_dev_sm_util_per_pod`, PRs #637/#638) was closed unmerged.
A time-sliced job's share of its GPUs therefore stays the stated even split (jobs.evaluation.sharing,
jobs.diagnosis.rules.shared_gpu), and its series are the whole GPU's.

Values are normalised to the registry's `unit` (ratios 0-1 for utilisations; GPU_UTIL and MEM_COPY_UTIL
arrive in percent, and so does DCGM 4.6's `DCGM_FI_DEV_GPU_UTIL_RATIO` despite its name: DCGM still stores
NVML's integer percent; NVLINK_BANDWIDTH_TOTAL, field 449, arrives as an instantaneous MB/s rate although
the exporter declares it `counter`, and is read as a gauge into B/s). Missing signals are reported with a
reason, never as zeros.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from jobs.metrics.sampling import (
    coverage_from_stats,
)

MEAN, MIN, MAX, COUNT = "mean", "min", "max", "count"
NONZERO = "nonzero"  # XID: number of GPUs with a non-zero code
SAMPLED = "sampled"  # GPUs' worth of each step the samples cover (see `sampled_vector`)
STAT_LABEL = "stat"
DEFAULT_RATE_WINDOW_S = 300.0  # default of the query builders; fetch_job_signals uses sampling.rate_window_s
DEFAULT_STEP_S = 30.0  # default grid step of the query builders (the poll step)


class Reading(enum.StrEnum):
    """How a field's samples are turned into a time series.

    The reading follows what the values *are*, not the `# TYPE` the exporter declares: field 449
    (NVLINK_BANDWIDTH_TOTAL) is declared `counter` but holds an instantaneous rate, so it is a GAUGE.
    """

    GAUGE = "gauge"  # sampled value, scaled; never rate()
    RATE = "rate"  # counter of ns throttled: rate(x[w]) / 1e9 = share of time
    ENERGY = "energy"  # counter of mJ: rate(x[w]) / 1e3 = average W; increase over the job = energy
    COUNTER = "counter"  # other cumulative counters: rate(x[w]) * scale (no registered field needs it now)
    CODE = "code"  # last error code (XID), or a 0/1 flag: any non-zero value matters, averages do not
    # A cumulative event count since driver load (ECC errors, remapped rows, link replays) read as its level
    # (the highest count in the step): what matters is how much it rose inside the job's window, taken
    # from the levels (jobs.diagnosis.rules.gpu_errors.counter_increase), never the absolute count.
    LEVEL = "level"
    BITMASK = "bitmask"  # clock event reasons: share of GPUs with each reason bit set


_CUMULATIVE = (Reading.RATE, Reading.ENERGY, Reading.COUNTER)

# Clock event reason bits worth a finding (DCGM_CLOCKS_EVENT_REASON_*); idle/app clocks/display are not.
THROTTLE_BITS: dict[str, int] = {
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
}

# Field 449 arrives in MB/s, decimal: 1 MB/s = 1e6 B/s. Sources: dcgm.md (measured as MB/s on H200 and
# cross-checked against `nvidia-smi nvlink -gt d`, KempnerInstitute/kempnerpulse #10, #11). A
# dcgm-exporter maintainer wrote KB/s (dcgm-exporter #472), which would be 1000x off the measurement;
# dcgm.md keeps the measured MB/s. Other readings of DCGM's conversion (a KiB/s delta / 1000, or MiB/s)
# differ from 1e6 by 2.4 % and 4.9 %: a few per cent, not the 10^4 of reading it as a KiB counter.
NVLINK_TOTAL_B_PER_MB = 1e6

# The NVML GPM exporter Princeton's jobstats moved to (jobstats #58: "we decided to concentrate on GPM metrics
# via NVML (https://github.com/plazonic/nvidia_gpu_prometheus_exporter) instead of continuing with DCGM").
# Source: plazonic/nvidia_gpu_prometheus_exporter main.go (namespace "nvidia_gpu"). Units as its code sets
# them, not as its names say: every `*_percent` / `*_util` GPM gauge is `Value / 100.0`, a 0-1 ratio like
# DCGM's profiling fields (NVML returns GPM utilisations in percent); PCIe and NVLink are `Value * 1024 *
# 1024`, bytes/s (NVML's GPM throughputs are MiB/s); `duty_cycle` is nvmlDeviceGetUtilizationRates' integer
# percent (= DCGM_FI_DEV_GPU_UTIL); power is milliwatts, memory bytes, temperature degrees C.
# wandb #11622 reads the same NVML GPM metrics but logs them to W&B under its DCGM collector's names; it
# exports nothing to Prometheus, so it adds no alias here.
GPM_EXPORTER = "nvidia_gpu_prometheus_exporter (NVML GPM)"
GPM_NAMESPACE = "nvidia_gpu_"
GPM_RELABEL = (
    "The GPM exporter labels a GPU `ordinal` (its index), `uuid`, `name`, `GPU_I_ID`, `jobid`, `userid` and "
    "carries no host label. Joined here the way dcgm-exporter's series are, which needs a Prometheus "
    "metric_relabel_configs on its scrape job: `ordinal` -> `gpu`, the node name (from `instance`, port "
    "stripped) -> `Hostname`, and `jobid` -> the job label the cluster uses (e.g. `hpc_job`)."
)


@dataclass(frozen=True, slots=True)
class Alias:
    """Another exporter's Prometheus name for the quantity a DCGM field measures.

    `scale` turns the alias's raw value into the signal's `unit` (it may differ from the DCGM field's
    scale: the GPM exporter's power is mW where DCGM's is W).
    """

    metric: str
    scale: float
    exporter: str
    raw_unit: str


@dataclass(frozen=True, slots=True)
class Signal:
    """One DCGM field: its Prometheus names, units, how to read it, and what its absence costs."""

    key: str
    field: str  # the DCGM field name as dcgm-exporter's counters CSV spells it (pre-4.6)
    metrics: tuple[str, ...]  # accepted Prometheus names, released name first, DCGM 4.6 name after
    raw_unit: str
    unit: str  # after `scale`
    scale: float
    reading: Reading
    default_enabled: bool
    prom_type: str  # gauge | counter, as the counters CSV declares it (may differ from `reading`)
    help: str
    hides: str
    group: str
    aliases: tuple[Alias, ...] = ()
    #: How to collect a signal that is not a dcgm-exporter field (a serving engine's counter); empty = the
    #: counters-CSV line (`enable_line`).
    enable_hint: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        """Every Prometheus name read for this signal: the DCGM names (`metrics`), then the aliases'."""
        return (*self.metrics, *(a.metric for a in self.aliases))

    def scale_of(self, metric: str) -> float:
        """The factor from `metric`'s raw value to `unit` (the alias's own scale for an alias)."""
        for a in self.aliases:
            if a.metric == metric:
                return a.scale
        if metric in self.metrics:
            return self.scale
        raise KeyError(f"{metric} is not a name of signal {self.key}")

    @property
    def enable_line(self) -> str:
        """The line to add to dcgm-exporter's counters CSV (`-f`) to collect this field, or, for a signal
        another exporter emits, what to switch on there (`enable_hint`)."""
        return self.enable_hint or f"{self.field}, {self.prom_type}, {self.help}"

    @property
    def stats(self) -> tuple[str, ...]:
        """Names of the aggregate series `aggregate_query` returns for this signal."""
        if self.reading is Reading.CODE:
            return (MAX, NONZERO, COUNT)
        if self.reading is Reading.BITMASK:
            return (*THROTTLE_BITS, COUNT)
        return (MEAN, MIN, MAX, COUNT)

    def normalise(self, raw: np.ndarray | float) -> np.ndarray:
        """Raw exporter values (gauges) in `unit`, e.g. GPU_UTIL percent -> ratio, field 449 MB/s -> B/s."""
        return np.asarray(raw, dtype=np.float64) * self.scale


def _s(
    key: str,
    field_name: str,
    new: str | None,
    raw_unit: str,
    unit: str,
    scale: float,
    reading: Reading,
    default: bool,
    help_text: str,
    hides: str,
    group: str,
    *,
    prom_type: str | None = None,
) -> Signal:
    # The CSV type follows the reading unless the exporter declares otherwise (field 449).
    declared = prom_type or ("counter" if reading in _CUMULATIVE else "gauge")
    metrics = (field_name,) if new is None else (field_name, new)
    return Signal(key, field_name, metrics, raw_unit, unit, scale, reading, default,
                  declared, help_text, hides, group)  # fmt: skip


_G, _R = Reading.GAUGE, Reading.RATE
_P = "DCGM_FI_PROF_"
_D = "DCGM_FI_DEV_"

# Units, readings and CSV types checked against reference/dcgm.md ("Fields the product reads") and
# dcgm-exporter's etc/default-counters.csv / dcp-metrics-included.csv; `default` against dcgm.md's
# "What a default dcgm-exporter emits".
SIGNALS: dict[str, Signal] = {s.key: s for s in (
    # dcgm.md: percent 0-100 (int), gauge; the 4.6 name GPU_UTIL_RATIO still carries NVML's integer percent.
    _s("gpu_util", f"{_D}GPU_UTIL", f"{_D}GPU_UTIL_RATIO", "%", "ratio", 0.01, _G, True,
       "GPU utilization (in %).",
       "the nvidia-smi number itself: idle GPUs and the false-saturation comparison", "utilisation"),
    # dcgm.md: ratio 0-1, gauge (profiling field, default on).
    _s("gr_engine_active", f"{_P}GR_ENGINE_ACTIVE", f"{_P}GR_ENGINE_UTIL_RATIO", "ratio", "ratio", 1.0, _G,
       True, "Ratio of time the graphics engine is active.",
       "a finer GPU-busy measure when GPU_UTIL is coarse", "utilisation"),
    # dcgm.md: ratio 0-1, gauge; off by default.
    _s("sm_active", f"{_P}SM_ACTIVE", f"{_P}SM_UTIL_RATIO", "ratio", "ratio", 1.0, _G, False,
       "The ratio of cycles an SM has at least 1 warp assigned.",
       "false saturation, launch overhead and stragglers: whether busy GPUs actually use their SMs",
       "utilisation"),
    # dcgm.md: ratio 0-1 (resident warps / max warps), gauge; off by default.
    _s("sm_occupancy", f"{_P}SM_OCCUPANCY", f"{_P}SM_OCCUPANCY_RATIO", "ratio", "ratio", 1.0, _G, False,
       "The ratio of number of warps resident on an SM.",
       "how full the SMs are (small kernels, low parallelism)", "utilisation"),
    # dcgm.md: ratio 0-1, gauge (default on).
    _s("tensor_active", f"{_P}PIPE_TENSOR_ACTIVE", f"{_P}TENSOR_UTIL_RATIO", "ratio", "ratio", 1.0, _G,
       True, "Ratio of cycles the tensor (HMMA) pipe is active.",
       "idle tensor cores, memory-bound work and the hardware cross-check of MFU", "utilisation"),
    # dcgm.md: HMMA / IMMA / DFMA pipes, ratio 0-1, gauges; not in the default set.
    _s("tensor_hmma_active", f"{_P}PIPE_TENSOR_HMMA_ACTIVE", f"{_P}HMMA_UTIL_RATIO", "ratio", "ratio", 1.0,
       _G, False, "Ratio of cycles the HMMA pipe is active.",
       "whether tensor work is half precision (bf16/fp16) as configured", "pipes"),
    _s("tensor_imma_active", f"{_P}PIPE_TENSOR_IMMA_ACTIVE", f"{_P}IMMA_UTIL_RATIO", "ratio", "ratio", 1.0,
       _G, False, "Ratio of cycles the IMMA pipe is active.", "integer (int8) tensor work", "pipes"),
    _s("tensor_dfma_active", f"{_P}PIPE_TENSOR_DFMA_ACTIVE", f"{_P}DFMA_UTIL_RATIO", "ratio", "ratio", 1.0,
       _G, False, "Ratio of cycles the DFMA pipe is active.", "FP64 tensor work", "pipes"),
    # dcgm.md: FP16 / FP32 / FP64 non-tensor pipes, ratio 0-1, gauges; off by default.
    _s("fp16_active", f"{_P}PIPE_FP16_ACTIVE", f"{_P}FP16_UTIL_RATIO", "ratio", "ratio", 1.0, _G, False,
       "Ratio of cycles the fp16 pipes are active.", "non-tensor half-precision math", "pipes"),
    _s("fp32_active", f"{_P}PIPE_FP32_ACTIVE", f"{_P}FP32_UTIL_RATIO", "ratio", "ratio", 1.0, _G, False,
       "Ratio of cycles the fp32 pipes are active.",
       "fp32 math where tensor cores were expected (AMP off)", "pipes"),
    _s("fp64_active", f"{_P}PIPE_FP64_ACTIVE", f"{_P}FP64_UTIL_RATIO", "ratio", "ratio", 1.0, _G, False,
       "Ratio of cycles the fp64 pipes are active.", "accidental double-precision math", "pipes"),
    # dcgm.md: ratio 0-1 (practical maximum ~0.8), gauge (default on).
    _s("dram_active", f"{_P}DRAM_ACTIVE", f"{_P}DRAM_UTIL_RATIO", "ratio", "ratio", 1.0, _G, True,
       "Ratio of cycles the device memory interface is active sending or receiving data.",
       "memory-bound kernels (DRAM busy, tensor idle)", "memory"),
    # dcgm.md: percent, gauge (default-counters.csv: "Memory utilization (in %)").
    _s("mem_copy_util", f"{_D}MEM_COPY_UTIL", None, "%", "ratio", 0.01, _G, True,
       "Memory utilization (in %).", "device-memory traffic when DRAM_ACTIVE is off", "memory"),
    # dcgm.md: MiB, gauges (default-counters.csv: "(in MiB)").
    _s("fb_used", f"{_D}FB_USED", None, "MiB", "MiB", 1.0, _G, True, "Framebuffer memory used (in MiB).",
       "memory headroom (room for a larger micro-batch)", "memory"),
    _s("fb_free", f"{_D}FB_FREE", None, "MiB", "MiB", 1.0, _G, True, "Framebuffer memory free (in MiB).",
       "the GPU's memory capacity, hence headroom as a share", "memory"),
    # dcgm.md: bytes/s incl. headers, gauges (a rate, not a byte counter: sampling.md); default on.
    _s("pcie_tx_bytes", f"{_P}PCIE_TX_BYTES", None, "B/s", "B/s", 1.0, _G, True,
       "The rate of data transmitted over the PCIe bus - including both protocol headers and data "
       "payloads - in bytes per second.", "device-to-host copies", "interconnect"),
    _s("pcie_rx_bytes", f"{_P}PCIE_RX_BYTES", None, "B/s", "B/s", 1.0, _G, True,
       "The rate of data received over the PCIe bus - including both protocol headers and data "
       "payloads - in bytes per second.", "host-to-device copies (pageable memory, data on the host)",
       "interconnect"),
    # dcgm.md: bytes/s, gauges; off by default.
    _s("nvlink_tx_bytes", f"{_P}NVLINK_TX_BYTES", None, "B/s", "B/s", 1.0, _G, False,
       "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
       "collective traffic per direction (communication wait)", "interconnect"),
    _s("nvlink_rx_bytes", f"{_P}NVLINK_RX_BYTES", None, "B/s", "B/s", 1.0, _G, False,
       "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
       "collective traffic per direction (communication wait)", "interconnect"),
    # dcgm.md: field 449 is an instantaneous MB/s rate (TX+RX, all links) that goes up and down, although
    # default-counters.csv declares it `counter`: the enable line keeps `counter` (what the exporter
    # says), the reading is a gauge (never rate()/increase()), * 1e6 gives B/s like the PROF NVLink fields.
    _s("nvlink_bandwidth_total", f"{_D}NVLINK_BANDWIDTH_TOTAL", f"{_D}NVLINK_THROUGHPUT_TOTAL", "MB/s",
       "B/s", NVLINK_TOTAL_B_PER_MB, _G, True, "Total number of NVLink bandwidth counters for all lanes.",
       "collective traffic bursts when NVLink TX/RX bytes are off", "interconnect", prom_type="counter"),
    # dcgm.md: W, gauge (default-counters.csv: "Power draw (in W)").
    _s("power_usage", f"{_D}POWER_USAGE", f"{_D}BOARD_POWER_WATTS", "W", "W", 1.0, _G, True,
       "Power draw (in W).", "power-cap throttling and idle GPUs drawing idle power", "power"),
    # dcgm.md: mJ counter since driver load; rate() * 1e-3 = W, increase over the job * 1e-3 = J.
    _s("total_energy", f"{_D}TOTAL_ENERGY_CONSUMPTION", None, "mJ", "W", 1e-3, Reading.ENERGY, True,
       "Total energy consumption since boot (in mJ).", "energy per job (and average power)", "power"),
    # dcgm.md: deg C, gauges.
    _s("gpu_temp", f"{_D}GPU_TEMP", f"{_D}GPU_TEMP_CELSIUS", "C", "C", 1.0, _G, True,
       "GPU temperature (in C).", "thermal throttling causes", "power"),
    _s("memory_temp", f"{_D}MEMORY_TEMP", f"{_D}MEMORY_TEMP_CELSIUS", "C", "C", 1.0, _G, True,
       "Memory temperature (in C).", "HBM thermal throttling", "power"),
    # dcgm.md: MHz, gauges.
    _s("sm_clock", f"{_D}SM_CLOCK", None, "MHz", "MHz", 1.0, _G, True, "SM clock frequency (in MHz).",
       "clocks below boost (throttling, stragglers) and the clock ratio of the MFU cross-check", "clocks"),
    _s("mem_clock", f"{_D}MEM_CLOCK", None, "MHz", "MHz", 1.0, _G, True, "Memory clock frequency (in MHz).",
       "memory clock drops", "clocks"),
    # dcgm.md: bitmask (DCGM_CLOCKS_EVENT_REASON_*), gauge; not in the default set.
    _s("clock_throttle_reasons", f"{_D}CLOCK_THROTTLE_REASONS", f"{_D}CLOCKS_EVENT_REASONS", "bitmask",
       "share of GPUs", 1.0, Reading.BITMASK, False, "Current clock throttle reasons.",
       "why clocks are low (power cap, thermal, HW slowdown)", "clocks"),
    # dcgm.md: cumulative ns; rate(x[w]) / 1e9 = share of time throttled. dcgm_fields.h's comment says usec;
    # NVIDIA/DCGM #266 and dcgm-exporter #589 (merged) correct it to ns. Off by default.
    _s("power_violation", f"{_D}POWER_VIOLATION", None, "ns", "share of time", 1e-9, _R, False,
       "Throttling duration due to power constraints (in ns).", "how long clocks were power-capped",
       "clocks"),
    _s("thermal_violation", f"{_D}THERMAL_VIOLATION", None, "ns", "share of time", 1e-9, _R, False,
       "Throttling duration due to thermal constraints (in ns).", "how long clocks were thermally capped",
       "clocks"),
    # GPU health (jobs.diagnosis.rules.gpu_errors). CSV lines and defaults from NVIDIA/dcgm-exporter
    # etc/default-counters.csv: PCIE_REPLAY_COUNTER, UNCORRECTABLE/CORRECTABLE_REMAPPED_ROWS and
    # ROW_REMAP_FAILURE are collected by default; the ECC, retired-page and NVLink error lines are commented
    # out there (off); ROW_REMAP_PENDING is not in the file (off). Meanings: DCGM API "Field Identifiers"
    # and NVIDIA's "GPU Memory Error Management" (row remapping on A100 and newer, dynamic page retirement
    # before). Counters are volatile (reset when the driver reloads or the GPU resets): read as levels.
    _s("pcie_replay", f"{_D}PCIE_REPLAY_COUNTER", None, "count", "count", 1.0, Reading.LEVEL, True,
       "Total number of PCIe retries.", "PCIe link retries (a marginal riser, slot or cable)", "health",
       prom_type="counter"),
    _s("ecc_sbe_volatile", f"{_D}ECC_SBE_VOL_TOTAL", None, "count", "count", 1.0, Reading.LEVEL, False,
       "Total number of single-bit volatile ECC errors.", "corrected memory errors", "health",
       prom_type="counter"),
    _s("ecc_dbe_volatile", f"{_D}ECC_DBE_VOL_TOTAL", None, "count", "count", 1.0, Reading.LEVEL, False,
       "Total number of double-bit volatile ECC errors.",
       "uncorrectable memory errors (the job's data may be corrupt)", "health", prom_type="counter"),
    _s("retired_dbe", f"{_D}RETIRED_DBE", None, "pages", "pages", 1.0, Reading.LEVEL, False,
       "Total number of retired pages due to double-bit errors.",
       "pages retired after uncorrectable errors (pre-Ampere GPUs)", "health", prom_type="counter"),
    _s("retired_pending", f"{_D}RETIRED_PENDING", None, "pages", "pages", 1.0, Reading.LEVEL, False,
       "Total number of pages pending retirement.", "page retirements waiting for a GPU reset", "health",
       prom_type="counter"),
    _s("uncorrectable_remapped_rows", f"{_D}UNCORRECTABLE_REMAPPED_ROWS", None, "rows", "rows", 1.0,
       Reading.LEVEL, True, "Number of remapped rows for uncorrectable errors",
       "HBM rows remapped after uncorrectable errors (A100 and newer)", "health", prom_type="counter"),
    _s("correctable_remapped_rows", f"{_D}CORRECTABLE_REMAPPED_ROWS", None, "rows", "rows", 1.0,
       Reading.LEVEL, True, "Number of remapped rows for correctable errors",
       "HBM rows remapped after repeated correctable errors", "health", prom_type="counter"),
    _s("row_remap_failure", f"{_D}ROW_REMAP_FAILURE", None, "flag", "flag", 1.0, Reading.CODE, True,
       "Whether remapping of rows has failed", "a GPU out of spare HBM rows (RMA)", "health",
       prom_type="gauge"),
    _s("row_remap_pending", f"{_D}ROW_REMAP_PENDING", None, "flag", "flag", 1.0, Reading.CODE, False,
       "Whether remapping of rows is pending", "a row remap waiting for a GPU reset", "health",
       prom_type="gauge"),
    _s("nvlink_crc_flit_errors", f"{_D}NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", None, "count", "count", 1.0,
       Reading.LEVEL, False, "Total number of NVLink flow-control CRC errors.",
       "NVLink signal-integrity errors (replayed)", "health", prom_type="counter"),
    _s("nvlink_crc_data_errors", f"{_D}NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", None, "count", "count", 1.0,
       Reading.LEVEL, False, "Total number of NVLink data CRC errors.",
       "NVLink signal-integrity errors (replayed)", "health", prom_type="counter"),
    _s("nvlink_replay_errors", f"{_D}NVLINK_REPLAY_ERROR_COUNT_TOTAL", None, "count", "count", 1.0,
       Reading.LEVEL, False, "Total number of NVLink retries.", "NVLink retransmissions (lost bandwidth)",
       "health", prom_type="counter"),
    _s("nvlink_recovery_errors", f"{_D}NVLINK_RECOVERY_ERROR_COUNT_TOTAL", None, "count", "count", 1.0,
       Reading.LEVEL, False, "Total number of NVLink recovery errors.",
       "NVLink links retrained after failing (a failing link or NVSwitch port)", "health",
       prom_type="counter"),
    # dcgm.md: gauge holding the last XID code.
    _s("xid_errors", f"{_D}XID_ERRORS", f"{_D}XID_ERROR", "code", "code", 1.0, Reading.CODE, True,
       "Value of the last XID error encountered.", "GPU hardware and driver errors during the job",
       "errors"),
)}  # fmt: skip

# GPM exporter names of the same quantities (see GPM_EXPORTER above for units). The GPM metrics are NVML's
# reading of the hardware counters DCGM's profiling fields read: nvtop #483 found SM and tensor activity from
# nvmlGpmMetricsGet equal to dcgmi's DCGM_FI_PROF_SM_ACTIVE / PIPE_TENSOR_ACTIVE to 3 decimals. SM_UTIL is
# "percentage of SMs that were busy" (SM_ACTIVE), ANY_TENSOR_UTIL any tensor pipe (PIPE_TENSOR_ACTIVE),
# DRAM_BW_UTIL "DRAM bw used vs theoretical maximum" (DRAM_ACTIVE), GRAPHICS_UTIL (GR_ENGINE_ACTIVE).
_GPM_ALIASES: dict[str, tuple[tuple[str, float, str], ...]] = {
    "gpu_util": (("duty_cycle", 0.01, "%"),),
    "gr_engine_active": (("graphics_util_percent", 1.0, "ratio"),),
    "sm_active": (("sm_util_percent", 1.0, "ratio"),),
    "sm_occupancy": (("sm_occupancy_percent", 1.0, "ratio"),),
    "tensor_active": (("any_tensor_util_percent", 1.0, "ratio"),),
    "fp16_active": (("fp16_util_percent", 1.0, "ratio"),),
    "fp32_active": (("fp32_util_percent", 1.0, "ratio"),),
    "fp64_active": (("fp64_util_percent", 1.0, "ratio"),),
    "dram_active": (("dram_bw_util_percent", 1.0, "ratio"),),
    "pcie_tx_bytes": (("pcie_tx_per_sec", 1.0, "B/s"),),
    "pcie_rx_bytes": (("pcie_rx_per_sec", 1.0, "B/s"),),
    "nvlink_tx_bytes": (("nvlink_total_tx_per_sec", 1.0, "B/s"),),
    "nvlink_rx_bytes": (("nvlink_total_rx_per_sec", 1.0, "B/s"),),
    "power_usage": (("power_usage_milliwatts", 1e-3, "mW"),),
    "gpu_temp": (("temperature_celsius", 1.0, "C"),),
    "fb_used": (("memory_used_bytes", 1.0 / 1048576.0, "B"),),  # bytes -> MiB
}
for _key, _aliases in _GPM_ALIASES.items():
    SIGNALS[_key] = replace(
        SIGNALS[_key],
        aliases=tuple(Alias(GPM_NAMESPACE + n, sc, GPM_EXPORTER, u) for n, sc, u in _aliases),
    )

#: The registry group of the serving engines' own counters (their registry: jobs.metrics.engine_signals).
ENGINE_GROUP = "engine"


DEFAULT_DISABLED: frozenset[str] = frozenset(k for k, s in SIGNALS.items() if not s.default_enabled)
"""Signal keys a default dcgm-exporter does not emit (SM_ACTIVE among them)."""

_BY_METRIC: dict[str, Signal] = {m: s for s in SIGNALS.values() for m in s.names}

ALIAS_METRICS: frozenset[str] = frozenset(a.metric for s in SIGNALS.values() for a in s.aliases)
"""Every non-DCGM name the registry reads (the GPM exporter's), for the presence look-ups."""


def signal_for_metric(metric: str) -> Signal | None:
    """The signal a Prometheus metric name belongs to (old or DCGM 4.6 name, or an alias), or None."""
    return _BY_METRIC.get(metric)


# --------------------------------------------------------------------------------------------------
# Readiness


@dataclass(frozen=True, slots=True)
class Readiness:
    """One line of the readiness panel."""

    key: str
    field: str
    present: bool
    default_enabled: bool
    hides: str
    enable: str
    metrics: tuple[str, ...]


def readiness(present: Iterable[str]) -> list[Readiness]:
    """Per registered field: present or missing, what its absence hides, and how to enable it.

    `present` may hold Prometheus metric names (old or DCGM 4.6 spelling, e.g. from
    `label_values("__name__", ...)`) or signal keys.
    """
    seen = set(present)
    out = []
    for sig in SIGNALS.values():
        here = sig.key in seen or any(m in seen for m in sig.names)
        if sig.default_enabled:
            how = (
                "in dcgm-exporter's default counters: check the exporter runs on the node and is scraped"
                + ("; profiling fields need a datacenter GPU (Volta or newer)" if "PROF" in sig.field else "")
            )
        else:
            how = f"add to the counters CSV (-f): {sig.enable_line}"
        out.append(Readiness(sig.key, sig.field, here, sig.default_enabled, sig.hides, how, sig.metrics))
    return out


# --------------------------------------------------------------------------------------------------
# Per-job result


@dataclass(frozen=True, slots=True)
class GpuKey:
    """One GPU of a job: host name and index."""

    hostname: str
    gpu: str

    def __str__(self) -> str:
        return f"{self.hostname}/{self.gpu}"


@dataclass(slots=True)
class SignalSeries:
    """One signal over a job: aggregate stats on `timestamps`, optional per-GPU matrix (NaN = no sample)."""

    key: str
    unit: str
    timestamps: np.ndarray
    stats: dict[str, np.ndarray]
    gpus: tuple[GpuKey, ...] = ()
    gpu_timestamps: np.ndarray | None = None
    per_gpu: np.ndarray | None = None  # shape (len(gpus), len(gpu_timestamps))

    @property
    def mean(self) -> np.ndarray | None:
        """Cross-GPU mean (None for codes and bitmasks)."""
        return self.stats.get(MEAN)

    @property
    def min(self) -> np.ndarray | None:
        """Cross-GPU minimum."""
        return self.stats.get(MIN)

    @property
    def max(self) -> np.ndarray | None:
        """Cross-GPU maximum."""
        return self.stats.get(MAX)

    @property
    def count(self) -> np.ndarray | None:
        """Number of GPUs reporting at each timestamp."""
        return self.stats.get(COUNT)

    @property
    def coverage(self) -> float:
        """Share of the job's GPU-time (its GPUs x the grid's windows) with samples, 0-1; NaN when the
        series has no cross-GPU stats (a per-GPU-only read). See
        `jobs.metrics.sampling.coverage_from_stats`."""
        return coverage_from_stats(self.stats.get(SAMPLED), self.stats.get(COUNT))


@dataclass(slots=True)
class JobSignals:
    """All signals of one job on one time grid; `missing` maps absent signal keys to reasons."""

    start: float
    end: float
    step: float
    timestamps: np.ndarray
    signals: dict[str, SignalSeries] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)

    def get(self, key: str) -> SignalSeries | None:
        """The signal's series, or None when it is missing."""
        return self.signals.get(key)

    @property
    def present(self) -> set[str]:
        """Keys of the signals that have data."""
        return set(self.signals)

    def coverage(self, key: str) -> float | None:
        """The signal's coverage (share of its GPU-time with samples), None when the signal is missing."""
        series = self.signals.get(key)
        return None if series is None else series.coverage


def grid(start: float, end: float, step: float) -> np.ndarray:
    """The evaluation timestamps Prometheus uses for a range query (start, start+step, ... <= end)."""
    n = int(np.floor((end - start) / step + 1e-9)) + 1
    return start + step * np.arange(max(n, 0), dtype=np.float64)


def heatmap_step(start: float, end: float, columns: int = 240, min_step_s: float = 30.0) -> float:
    """A whole-second step giving at most `columns` heatmap columns (never finer than the scrape)."""
    return float(max(min_step_s, np.ceil((end - start) / max(1, columns - 1))))


def describe(keys: Iterable[str] | None = None) -> list[Mapping[str, Any]]:
    """The registry as plain dicts (for docs, the API and the readiness page)."""
    chosen = [SIGNALS[k] for k in (keys if keys is not None else SIGNALS)]
    return [
        {
            "key": s.key,
            "field": s.field,
            "metrics": list(s.metrics),
            "raw_unit": s.raw_unit,
            "unit": s.unit,
            "reading": s.reading.value,
            "default_enabled": s.default_enabled,
            "hides": s.hides,
            "enable_line": s.enable_line,
            "group": s.group,
            "aliases": [
                {"metric": a.metric, "scale": a.scale, "exporter": a.exporter, "raw_unit": a.raw_unit}
                for a in s.aliases
            ],
        }
        for s in chosen
    ]
