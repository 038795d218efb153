"""A simulated job as the NVML GPM exporter jobstats uses emits it (plazonic/nvidia_gpu_prometheus_exporter).

Source: that exporter's main.go. Names are `nvidia_gpu_<name>`, every family a gauge; labels `ordinal`,
`minor_number`, `uuid`, `name`, `GPU_I_ID`, `jobid`, `userid` (no host label: Prometheus adds `instance`).
Values as its code sets them: GPM utilisations `Value / 100.0` (0-1 ratios despite `_percent` in the names),
PCIe and NVLink `Value * 1024 * 1024` (bytes/s), `duty_cycle` NVML's integer percent, power in milliwatts
(nvmlDeviceGetPowerUsage), memory in bytes, temperature in C. GPM metrics need two GPM samples, so the first
collection after the exporter starts has none: the first scrape of a simulated job carries no GPM family.

`exporter_text` is the exporter's /metrics body; `openmetrics_lines` is what Prometheus stores after the
relabelling `jobs.metrics.signals.GPM_RELABEL` describes (ordinal -> gpu, node -> Hostname, jobid ->
hpc_job), which is how the product joins these series to a job.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from jobs.metrics.signals import SIGNALS
from jobs.simulate.core import SimResult

GPM_PORT = 9445  # the exporter's default -web.listen-address
# Families computed from two GPM samples (absent on the exporter's first collection).
_NEEDS_TWO_SAMPLES = frozenset(
    {"gr_engine_active", "sm_active", "sm_occupancy", "tensor_active", "fp16_active", "fp32_active",
     "fp64_active", "dram_active", "pcie_tx_bytes", "pcie_rx_bytes", "nvlink_tx_bytes", "nvlink_rx_bytes"}
)  # fmt: skip
_INTEGER = frozenset({"gpu_util", "power_usage", "gpu_temp", "fb_used"})


def gpm_values(res: SimResult, key: str) -> np.ndarray | None:
    """The GPM exporter's raw values of signal `key` for the job (G, T), NaN where none; None when the
    exporter has no such family or the job has no such field."""
    sig = SIGNALS[key]
    if not sig.aliases or key not in res.fields:
        return None
    # Raw DCGM value -> the signal's unit -> the alias's raw unit.
    values = res.fields[key] * sig.scale / sig.aliases[0].scale
    if key in _INTEGER:
        values = np.rint(values)
    if key in _NEEDS_TWO_SAMPLES:
        values = values.copy()
        values[:, 0] = np.nan
    return values


def _labels(res: SimResult, g: int, *, stored: bool) -> dict[str, str]:
    gpu = res.gpus[g]
    labels = {
        "GPU_I_ID": "",
        "jobid": str(res.spec.job_id or ""),
        "minor_number": str(gpu.index),
        "name": res.spec.gpu_model,
        "ordinal": str(gpu.index),
        "userid": "",
        "uuid": gpu.uuid,
    }
    if stored:
        labels |= {"instance": f"{gpu.hostname}:{GPM_PORT}", "job": "nvidia-gpu-gpm"}
        # The relabelling of GPM_RELABEL: the product joins on these like on dcgm-exporter's labels.
        labels |= {"gpu": str(gpu.index), "Hostname": gpu.hostname}
        if res.spec.job_id is not None:
            labels["hpc_job"] = str(res.spec.job_id)
    return dict(sorted(labels.items()))


def _text(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def _value(v: float, key: str) -> str:
    return str(int(v)) if key in _INTEGER else format(float(v), ".6g")


def openmetrics_lines(results: Sequence[SimResult]) -> Iterator[str]:
    """OpenMetrics of every GPM sample as Prometheus stores it after the relabelling (with `# EOF`)."""
    for key, sig in SIGNALS.items():
        members = [(r, v) for r in results if (v := gpm_values(r, key)) is not None]
        if not members:
            continue
        name = sig.aliases[0].metric
        yield f"# HELP {name} {sig.help}\n# TYPE {name} gauge\n"
        for res, values in members:
            for g in range(len(res.gpus)):
                prefix = f"{name}{{{_text(_labels(res, g, stored=True))}}} "
                for t in np.flatnonzero(np.isfinite(values[g])):
                    yield f"{prefix}{_value(values[g, t], key)} {res.timestamps[t]:.3f}\n"
    yield "# EOF\n"


def exporter_text(results: Sequence[SimResult], at: float, hostname: str) -> str:
    """The GPM exporter's /metrics body on `hostname` at time `at` (latest sample <= at)."""
    lines: list[str] = []
    for key, sig in SIGNALS.items():
        body: list[str] = []
        for res in results:
            values = gpm_values(res, key)
            idx = int(np.searchsorted(res.timestamps, at, side="right")) - 1
            if values is None or idx < 0:
                continue
            for g, gpu in enumerate(res.gpus):
                if gpu.hostname == hostname and np.isfinite(values[g, idx]):
                    body.append(f"{sig.aliases[0].metric}{{{_text(_labels(res, g, stored=False))}}} "
                                f"{_value(values[g, idx], key)}")  # fmt: skip
        if body:
            name = sig.aliases[0].metric
            lines += [f"# HELP {name} {sig.help}", f"# TYPE {name} gauge", *body]
    return "\n".join(lines) + "\n"
