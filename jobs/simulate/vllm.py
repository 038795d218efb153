"""A serving engine's MFU counters as vLLM exports them with `--enable-mfu-metrics`, and as Prometheus stores
them after a Kubernetes scrape (pure numpy).

Names, type and labels: vLLM docs, "Model Flops Utilization (MFU) Performance Metrics":
`vllm:estimated_flops_per_gpu_total` (Counter, "Estimated number of floating point operations per GPU (for
Model Flops Utilization calculations)"), `vllm:estimated_read_bytes_per_gpu_total` and
`vllm:estimated_write_bytes_per_gpu_total` (Counters, bytes), each labelled `model_name` and `engine` (the
engine index, "0" for one engine per server). SGLang's `--enable-mfu-metrics` exports the same three as
`sglang:...` (its observability/metrics_collector.py); `engine="sglang"` here writes those names.

The target labels are what a ServiceMonitor scrape of the server's pod adds (prometheus-operator's
kubernetes_sd pod/endpoints relabelling): `namespace`, `pod`, `container`, `service`, `endpoint`, `job`,
`instance` (pod IP:port). The counters count from the server's start (0 there) and restart from 0 when the
server restarts (`restart_at`), as a process-local prometheus_client Counter does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from jobs.metrics.signals import ENGINE_SIGNALS

ENGINES = ("vllm", "sglang")
SERVER_PORT = 8000


@dataclass(slots=True)
class EngineSeries:
    """The servers' samples: per metric name, (labels, cumulative values over `timestamps`)."""

    timestamps: np.ndarray
    series: dict[str, list[tuple[dict[str, str], np.ndarray]]]


def simulate_engine(
    pods: Sequence[str],
    timestamps: np.ndarray,
    flops_per_gpu_s: float,
    *,
    read_bytes_per_gpu_s: float = 0.0,
    write_bytes_per_gpu_s: float = 0.0,
    namespace: str = "llm",
    model_name: str = "meta-llama/Llama-2-7b-hf",
    engine: str = "vllm",
    restart_at: float | None = None,
    noise: float = 0.0,
    seed: int = 0,
) -> EngineSeries:
    """One serving engine per pod in `pods`, scraped at `timestamps`, doing `flops_per_gpu_s` FLOP/s per
    GPU (and the byte rates); counters start at 0 at the first timestamp (the server's start) and again at
    `restart_at` (a server restart: rate() sees a counter reset)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if min(flops_per_gpu_s, read_bytes_per_gpu_s, write_bytes_per_gpu_s) < 0:
        raise ValueError("rates must be non-negative")
    rng = np.random.default_rng(seed)
    ts = np.asarray(timestamps, dtype=np.float64)
    dt = np.diff(ts, prepend=ts[0])
    out: dict[str, list[tuple[dict[str, str], np.ndarray]]] = {}
    rates = {
        "engine_flops": flops_per_gpu_s,
        "engine_read_bytes": read_bytes_per_gpu_s,
        "engine_write_bytes": write_bytes_per_gpu_s,
    }
    for i, pod in enumerate(pods):
        labels = {
            "model_name": model_name, "engine": "0", "namespace": namespace, "pod": pod,
            "container": engine, "service": f"{engine}-server", "endpoint": "http", "job": f"{engine}-server",
            "instance": f"10.0.0.{i + 10}:{SERVER_PORT}",
        }  # fmt: skip
        for key, rate in rates.items():
            metric = next(m for m in ENGINE_SIGNALS[key].metrics if m.startswith(f"{engine}:"))
            step = np.clip(rate * (1.0 + noise * rng.standard_normal(ts.size)), 0.0, None) * dt
            if restart_at is None:
                values = np.cumsum(step)
            else:
                # The counter restarts from 0 at the restart and counts only what follows it.
                after = ts >= restart_at
                values = np.where(after, 0.0, np.cumsum(np.where(after, 0.0, step)))
                since = np.where(after, step, 0.0)
                first = int(np.argmax(after)) if after.any() else ts.size
                if first < ts.size:
                    since[first] = rate * (ts[first] - restart_at)
                values = np.where(after, np.cumsum(since), values)
            out.setdefault(metric, []).append((dict(labels), values))
    return EngineSeries(ts, out)


def openmetrics_lines(engines: EngineSeries) -> Iterator[str]:
    """The samples as Prometheus stored them, in OpenMetrics for promtool (counter families named without
    `_total`, as OpenMetrics names them); no `# EOF` (append to another exporter's lines, then end)."""
    for metric, rows in engines.series.items():
        yield f"# TYPE {metric.removesuffix('_total')} counter\n"
        for labels, values in rows:
            text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            for t, v in zip(engines.timestamps, values, strict=True):
                yield f"{metric}{{{text}}} {v:.17g} {t:.3f}\n"
