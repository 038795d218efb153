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

`simulate_server` is a whole serving job: its dcgm-exporter series follow a request load (`ServingLoad`)
and its engine emits the FLOP and byte counters plus vLLM's token counters (`vllm:prompt_tokens_total`,
`vllm:generation_tokens_total`, "Number of prefill/generation tokens processed", vLLM docs "Production
Metrics") from the same load, so the engine's MFU, the forward-FLOPs MFU of its tokens and the tensor
activity of its GPUs agree as they do on a real server.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from jobs.evaluation.flops import utilisation
from jobs.metrics.engine_signals import ENGINE_SIGNALS
from jobs.simulate.core import SimResult, SimSpec, Throughput, simulate
from jobs.simulate.core import _fields as profile_fields
from jobs.simulate.scenarios import Ctx, Profile

ENGINES = ("vllm", "sglang")
SERVER_PORT = 8000


@dataclass(slots=True)
class EngineSeries:
    """The servers' samples: per metric name, (labels, cumulative values over `timestamps`)."""

    timestamps: np.ndarray
    series: dict[str, list[tuple[dict[str, str], np.ndarray]]]


Rate = float | np.ndarray  # one rate, or one per timestamp (a server under a varying load)


def simulate_engine(
    pods: Sequence[str],
    timestamps: np.ndarray,
    flops_per_gpu_s: Rate,
    *,
    read_bytes_per_gpu_s: Rate = 0.0,
    write_bytes_per_gpu_s: Rate = 0.0,
    namespace: str = "llm",
    model_name: str = "meta-llama/Llama-2-7b-hf",
    engine: str = "vllm",
    restart_at: float | None = None,
    noise: float = 0.0,
    seed: int = 0,
) -> EngineSeries:
    """One serving engine per pod in `pods`, scraped at `timestamps`, doing `flops_per_gpu_s` FLOP/s per
    GPU (and the byte rates; each a number or one value per timestamp, the rate over the interval ending
    there); counters start at 0 at the first timestamp (the server's start) and again at `restart_at` (a
    server restart: rate() sees a counter reset)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    ts = np.asarray(timestamps, dtype=np.float64)
    rates = {
        "engine_flops": np.broadcast_to(np.asarray(flops_per_gpu_s, dtype=np.float64), ts.shape),
        "engine_read_bytes": np.broadcast_to(np.asarray(read_bytes_per_gpu_s, dtype=np.float64), ts.shape),
        "engine_write_bytes": np.broadcast_to(np.asarray(write_bytes_per_gpu_s, dtype=np.float64), ts.shape),
    }
    if any((r < 0).any() or not np.isfinite(r).all() for r in rates.values()):
        raise ValueError("rates must be finite and non-negative")
    rng = np.random.default_rng(seed)
    dt = np.diff(ts, prepend=ts[0])
    out: dict[str, list[tuple[dict[str, str], np.ndarray]]] = {}
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
                    since[first] = rate[first] * (ts[first] - restart_at)
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


# --------------------------------------------------------------------------------------------------
# A serving job: GPU series that follow a request load, and the engine's counters from the same load

#: vLLM's token counters (vLLM docs, "Production Metrics": Counters labelled model_name and engine).
PROMPT_TOKENS_METRIC = "vllm:prompt_tokens_total"
GENERATION_TOKENS_METRIC = "vllm:generation_tokens_total"
_HELP = {
    PROMPT_TOKENS_METRIC: "Number of prefill tokens processed.",
    GENERATION_TOKENS_METRIC: "Number of generation tokens processed.",
    **{m: s.help for s in ENGINE_SIGNALS.values() for m in s.metrics},
}


@dataclass(frozen=True, slots=True)
class ServingLoad:
    """A model server's request load and how it serves it (plain values: the demo stores it as JSON).

    The load is the mean number of requests in flight (`in_flight`), following a day: `night_in_flight`
    at 03:00 UTC, `peak_in_flight` twelve hours later, times slow bursts (a log-normal AR(1) with a
    `burst_minutes` correlation time). Each request sends `prompt_tokens` and generates `output_tokens` at
    `decode_tokens_per_s` per sequence after a prefill at `prefill_tokens_per_s`.
    """

    namespace: str = "llm-serving"
    model_name: str = "meta-llama/Llama-3.1-8B-Instruct"
    night_in_flight: float = 0.25
    peak_in_flight: float = 3.0
    burst_sigma: float = 0.25
    burst_minutes: float = 20.0
    prompt_tokens: int = 2000
    output_tokens: int = 250
    decode_tokens_per_s: float = 75.0
    prefill_tokens_per_s: float = 8000.0

    def __post_init__(self) -> None:
        if not 0 < self.night_in_flight <= self.peak_in_flight:
            raise ValueError("need 0 < night_in_flight <= peak_in_flight")
        if min(self.prompt_tokens, self.output_tokens) < 1:
            raise ValueError("prompt_tokens and output_tokens must be at least 1")
        if min(self.decode_tokens_per_s, self.prefill_tokens_per_s, self.burst_minutes) <= 0:
            raise ValueError("token rates and burst_minutes must be positive")

    @property
    def request_s(self) -> float:
        """Seconds one request is in flight: its prefill, then its decode."""
        return self.prompt_tokens / self.prefill_tokens_per_s + self.output_tokens / self.decode_tokens_per_s

    def in_flight(self, timestamps: np.ndarray, seed: int) -> np.ndarray:
        """Mean requests in flight over each sample interval (deterministic in `timestamps` and `seed`)."""
        ts = np.asarray(timestamps, dtype=np.float64)
        hour = (ts % 86400.0) / 3600.0
        day = 0.5 - 0.5 * np.cos(2.0 * math.pi * (hour - 3.0) / 24.0)  # 0 at 03:00 UTC, 1 at 15:00
        base = self.night_in_flight + (self.peak_in_flight - self.night_in_flight) * day
        rng = np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(b"serving-load")]))
        dt = float(np.median(np.diff(ts))) if ts.size > 1 else 60.0
        phi = math.exp(-dt / (60.0 * self.burst_minutes))
        shocks = rng.standard_normal(ts.size) * self.burst_sigma * math.sqrt(1.0 - phi * phi)
        walk = np.empty(ts.size)
        level = 0.0
        for i, shock in enumerate(shocks):  # AR(1): bursts last about burst_minutes
            level = phi * level + shock
            walk[i] = level
        return base * np.exp(walk - 0.5 * self.burst_sigma**2)


@dataclass(slots=True)
class Server:
    """A simulated serving job: its dcgm-exporter result and its engine's counters on the same grid."""

    result: SimResult
    engines: EngineSeries
    in_flight: np.ndarray
    prompt_tokens_per_s: np.ndarray
    generation_tokens_per_s: np.ndarray
    engine_flops_per_gpu_s: np.ndarray

    @property
    def pod(self) -> str:
        """The server's pod (its GPUs' `pod` label and its engine series' `pod` target label)."""
        return self.result.gpus[0].labels["pod"]


def server_pod(spec: SimSpec) -> str:
    """The pod name the simulator gives a Kubernetes-labelled job's GPUs on its first host."""
    return f"{spec.job_id}-worker-0"


def forward_flops(spec: SimSpec, context: float | np.ndarray) -> float | np.ndarray:
    """FLOPs of one token's forward pass attending to `context` tokens: 2N + 4·L·H·Q·C (Kaplan et al. 2020
    for 2N; the attention term is the forward third of PaLM's 12·L·H·Q·T, as jobs.evaluation.flops)."""
    s = spec.shape()
    return 2.0 * spec.model_params + 4.0 * s["n_layers"] * s["n_heads"] * s["head_dim"] * context


def simulate_server(spec: SimSpec, load: ServingLoad, *, engine: str = "vllm") -> Server:
    """One serving job (`spec.job_labels` must be "kubernetes": its GPUs carry namespace/pod, the join a
    serving engine's series allow) under `load`, one server pod over all of the job's GPUs (tensor parallel).

    The physics, per sample interval with c requests in flight on average:
    * requests arrive at λ = c / request_s (Little's law); prompt tokens/s = λ·P, generated tokens/s = λ·O;
    * GPU_UTIL is the share of time any request is in flight: with Poisson arrivals the number in flight is
      Poisson with mean c (an M/G/∞ queue), so busy = 1 - e^(-c): a lightly loaded server idles between
      requests, a loaded one reads ~100 % however large its batch (continuous batching);
    * the engine's FLOPs are its forward passes: prefill tokens attend to P/2 context tokens on average (a
      causal prompt), decode tokens to P + O/2, each 2N + 4·L·H·Q·C, split over the job's GPUs; bytes read
      are the weights once per decode step per GPU (decode is memory-bound), bytes written the KV cache
      (2·L·hidden bf16 values per token);
    * tensor activity follows the FLOP rate, with the simulator's ~12 % margin of tensor x clock over MFU.
    """
    if spec.job_labels != "kubernetes" or spec.job_id is None:
        raise ValueError("a serving job is joined by its pod: simulate it with job_labels='kubernetes'")
    base = simulate(replace(spec, scenario="healthy"))
    ts, model, gpus = base.timestamps, base.model, len(base.gpus)
    c = load.in_flight(ts, spec.seed)
    rate = c / load.request_s
    prompt_tps, gen_tps = rate * load.prompt_tokens, rate * load.output_tokens
    p, o = float(load.prompt_tokens), float(load.output_tokens)
    flops_per_gpu = (
        prompt_tps * forward_flops(spec, p / 2) + gen_tps * forward_flops(spec, p + o / 2)
    ) / gpus
    peak = model.peak_bf16_tflops * 1e12
    engine_mfu = float(np.mean(flops_per_gpu)) / peak
    busy = 1.0 - np.exp(-c)
    shape = spec.shape()
    weights_per_gpu = 2.0 * spec.model_params / gpus  # bf16 bytes
    decode_steps = busy * load.decode_tokens_per_s  # steps/s: one token per running sequence per step
    read_bps = decode_steps * weights_per_gpu
    write_bps = (prompt_tps + gen_tps) * 2.0 * shape["n_layers"] * shape["hidden"] * 2.0 / gpus
    host_index = np.zeros(gpus, dtype=int)
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, zlib.crc32(b"serving")]))
    ctx = Ctx(rng, gpus, ts.size, spec.step_s, host_index, model, dict(spec.params))
    act = np.broadcast_to(busy, (gpus, ts.size)).copy()  # tensor-parallel ranks step together
    profile = Profile(
        activity=act,
        mfu=engine_mfu,
        sm=0.55,  # decode kernels (GEMV-like GEMMs, paged attention) keep fewer SMs busy than training
        occupancy=0.30,
        tensor_shape=np.broadcast_to(flops_per_gpu / max(float(flops_per_gpu.max()), 1.0), act.shape).copy(),
        dram=0.60,  # decode reads the weights every step: memory-bound
        pcie_rx=0.05e9,
        pcie_tx=0.02e9,
        nvlink=4e9 if gpus > 1 else 0.0,  # tensor-parallel all-reduces of activations, small
        fb=0.90,  # vLLM preallocates --gpu-memory-utilization (0.9) for weights and the KV cache
    )
    fields, _ = profile_fields(profile, model, ctx, spec.noise)
    for key, arr in list(fields.items()):
        if key not in base.fields:
            fields.pop(key)  # disabled, or not reported (MIG), as in the plain simulation
        elif arr.shape == base.fields[key].shape:
            arr[np.isnan(base.fields[key])] = np.nan  # the same failed scrapes
    pod = server_pod(spec)
    engines = simulate_engine([pod], ts, flops_per_gpu, read_bytes_per_gpu_s=read_bps,
                              write_bytes_per_gpu_s=write_bps, namespace=spec.namespace,
                              model_name=load.model_name, engine=engine)  # fmt: skip
    labels = dict(next(iter(engines.series.values()))[0][0])
    dt = np.diff(ts, prepend=ts[0])
    if engine == "vllm":  # SGLang's token counters have other names; only the FLOP counters are shared
        for metric, tps in ((PROMPT_TOKENS_METRIC, prompt_tps), (GENERATION_TOKENS_METRIC, gen_tps)):
            engines.series[metric] = [(dict(labels), np.cumsum(np.rint(tps * dt)))]
    tokens = prompt_tps + gen_tps
    # The product's default serving context (half of seq_len) gives the forward-FLOPs MFU the job is
    # evaluated with; the engine counts the context each token actually attends to.
    per_token = float(forward_flops(spec, shape["seq_len"] / 2))
    throughput = Throughput(
        tokens_per_s=tokens,
        tokens_total=np.cumsum(tokens * dt),
        mfu=float(utilisation(per_token, float(tokens.mean()), gpus * peak)),
        flops_per_token=per_token,
        peak_flops_per_gpu=peak,
        model_params=spec.model_params,
    )
    truth = {"scenario": "serving", "code": "", "mfu": engine_mfu, "engine_mfu": engine_mfu,
             "in_flight_mean": float(c.mean()), "util_mean": float(busy.mean())}  # fmt: skip
    result = replace(base, spec=spec, fields=fields, throughput=throughput, truth=truth)
    return Server(result, engines, c, prompt_tps, gen_tps, flops_per_gpu)


def truncate_engines(engines: EngineSeries, until: float) -> EngineSeries:
    """Only what the server has exported by `until` (a running server's later samples do not exist yet)."""
    n = int(np.searchsorted(engines.timestamps, until, side="right"))
    return EngineSeries(
        engines.timestamps[:n],
        {m: [(labels, values[:n]) for labels, values in rows] for m, rows in engines.series.items()},
    )


def exposition_text(engines: EngineSeries, at: float, step_s: float) -> str:
    """The servers' /metrics counters at time `at` (the latest sample at or before it), in the Prometheus
    text format prometheus_client writes (`# HELP`, `# TYPE name_total counter`); empty once `at` is past
    the last sample by more than `step_s`. The target labels a ServiceMonitor adds are in the labels
    already (the demo's Prometheus scrapes with honor_labels)."""
    ts = engines.timestamps
    idx = int(np.searchsorted(ts, at, side="right")) - 1
    if idx < 0 or at > ts[-1] + step_s:
        return ""
    lines: list[str] = []
    for metric, rows in engines.series.items():
        lines += [f"# HELP {metric} {_HELP.get(metric, metric)}", f"# TYPE {metric} counter"]
        for labels, values in rows:
            text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            lines.append(f"{metric}{{{text}}} {float(values[idx]):.17g}")
    return "\n".join(lines) + "\n"
