"""Turn a scenario profile into dcgm-exporter fields per GPU and sample, plus the job's throughput.

Values are raw, as the exporter reports them (units from reference/dcgm.md): GPU_UTIL and MEM_COPY_UTIL in
integer percent, profiling activities as 0-1 ratios, PCIe and NVLink TX/RX in bytes/s, counters cumulative
(energy in mJ since driver load, violations in ns), clocks in MHz, frame buffer in MiB, power in W.
NVLINK_BANDWIDTH_TOTAL (field 449) is an instantaneous rate in MB/s, TX+RX over all links, although the
exporter's `# TYPE` line calls it a counter. Missing samples are NaN (a whole host's scrape is lost at
once, as when an exporter or node is unreachable).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from jobs.evaluation.flops import utilisation
from jobs.metrics.signals import SIGNALS, Reading, signal_for_metric
from jobs.simulate.exporter import Exporter, Workload, record
from jobs.simulate.gpus import GpuModel, gpu_model, gpu_uuid, pci_bus_id
from jobs.simulate.scenarios import SCENARIOS, Ctx, Profile

# Field 449's unit: dcgm.md measures it as MB/s, decimal (KempnerInstitute/kempnerpulse #10, #11). Written
# out here rather than taken from jobs.metrics.signals so that the registry's read-back is checked, not
# mirrored.
NVLINK_TOTAL_BYTES_PER_UNIT = 1e6
DEFAULT_START = 1_767_225_600.0  # 2026-01-01T00:00:00Z: fixed, so simulated data is reproducible
EXTRA_KEYS = ("fb_reserved", "enc_util", "dec_util")
HOST_LABEL_NAMES = ("Hostname", "hostname", "exported_Hostname", "exported_hostname")


@dataclass(frozen=True, slots=True)
class SimSpec:
    """One simulated job. `disabled` takes signal keys, DCGM field names or metric names."""

    scenario: str = "healthy"
    gpus: int = 8
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    hosts: tuple[str, ...] = ()  # default gpu-node-001, ... as many as needed
    gpus_per_host: int = 8
    first_gpu: int = 0  # index of the job's first GPU on each host (jobs sharing a node)
    job_id: str | None = "48213"
    job_labels: Literal["hpc_job", "kubernetes", "none"] = "hpc_job"
    namespace: str = "llm"
    start: float = DEFAULT_START
    duration_s: float = 3600.0
    step_s: float = 30.0
    seed: int = 0
    noise: float = 0.02
    missing_fraction: float = 0.0
    disabled: frozenset[str] = frozenset()
    host_label: str = "Hostname"  # "hostname" for 2026 exporters; exported_* as stored after a clash
    uuid_label: str = "UUID"  # "uuid" with --use-old-namespace
    metric_names: Literal["legacy", "dcgm46"] = "legacy"
    driver_version: str = "550.90.07"
    model_params: float = 7e9
    params: dict[str, Any] = field(default_factory=dict)  # scenario knobs (stall_every, xid, ...)
    #: Model shape for PaLM FLOPs (6N + 12·L·H·Q·T); None = derived from model_params (`model_shape`).
    n_layers: int | None = None
    hidden: int | None = None
    n_heads: int | None = None
    seq_len: int | None = None
    #: A step-level workload recorded through the exporter's windows (jobs.simulate.exporter) instead of
    #: the scenario's sample-grid profile; the grid step becomes the exporter's scrape interval.
    workload: Workload | None = None
    exporter: Exporter | None = None
    #: MIG: (GPU_I_ID, GPU_I_PROFILE) per GPU of the job, e.g. (("1", "3g.40gb"),), labelled on its series
    #: the way dcgm-exporter labels a MIG instance's (reference/dcgm.md "Labels": `gpu`/`UUID` stay the
    #: parent GPU's). Such an instance has no DCGM_FI_DEV_GPU_UTIL (NVIDIA/dcgm-exporter #216, #50: use
    #: GR_ENGINE_ACTIVE), so its GPU_UTIL row is left empty. The throughput is not scaled to the slice.
    mig: tuple[tuple[str, str], ...] = ()

    def shape(self) -> dict[str, int]:
        """n_layers, hidden, n_heads, head_dim, seq_len of the simulated model (given or derived)."""
        derived = model_shape(self.model_params)
        out = {
            "n_layers": self.n_layers or derived["n_layers"],
            "hidden": self.hidden or derived["hidden"],
            "n_heads": self.n_heads or derived["n_heads"],
            "seq_len": self.seq_len or derived["seq_len"],
        }
        out["head_dim"] = out["hidden"] // out["n_heads"]
        return out


def model_shape(n_params: float) -> dict[str, int]:
    """A plausible dense-transformer shape for `n_params` non-embedding parameters (N ~ 12·L·h²).

    Layers 24 below 3e9 parameters, 32 below 2e10, 80 above (GPT-2/LLaMA-like); the hidden size solves
    12·L·h² = N rounded to a multiple of 128, heads of 128 dims, sequences of 4096 tokens (2048 below 3e9).
    """
    layers = 24 if n_params < 3e9 else 32 if n_params < 2e10 else 80
    hidden = max(128, round(math.sqrt(n_params / (12.0 * layers)) / 128.0) * 128)
    return {"n_layers": layers, "hidden": hidden, "n_heads": hidden // 128,
            "seq_len": 2048 if n_params < 3e9 else 4096}  # fmt: skip


def palm_flops_per_token(spec: SimSpec) -> float:
    """6N + 12·L·H·Q·T (PaLM appendix B; H·Q = hidden), as jobs.evaluation.flops computes it for MFU."""
    s = spec.shape()
    return 6.0 * spec.model_params + 12.0 * s["n_layers"] * s["n_heads"] * s["head_dim"] * s["seq_len"]


@dataclass(frozen=True, slots=True)
class SimGpu:
    """One GPU of a job with its exporter labels, in the exporter's order."""

    hostname: str
    index: int
    uuid: str
    labels: dict[str, str]

    @property
    def key(self) -> str:
        """`host/index`, as jobs.metrics.signals.GpuKey prints it."""
        return f"{self.hostname}/{self.index}"


@dataclass(frozen=True, slots=True)
class Throughput:
    """What the training loop would report, consistent with the scenario's MFU (6N FLOPs per token)."""

    tokens_per_s: np.ndarray  # (T,)
    tokens_total: np.ndarray  # (T,) cumulative counter
    mfu: float
    flops_per_token: float
    peak_flops_per_gpu: float
    model_params: float


@dataclass(slots=True)
class SimResult:
    """Simulated exporter output of one job: fields[key] is (GPUs, samples) of raw values, NaN = missing."""

    spec: SimSpec
    model: GpuModel
    timestamps: np.ndarray
    gpus: list[SimGpu]
    fields: dict[str, np.ndarray]
    throughput: Throughput
    truth: dict[str, Any]
    #: Seconds after each grid time at which each GPU's samples were scraped (G,); None = on the grid.
    sample_offsets: np.ndarray | None = None

    def metric_name(self, key: str) -> str:
        """The Prometheus metric name this job's exporter uses for a signal key (or extra key)."""
        if key in SIGNALS:
            metrics = SIGNALS[key].metrics
            return metrics[-1] if self.spec.metric_names == "dcgm46" else metrics[0]
        return _EXTRA_METRICS[key]

    def gpu_refs(self) -> list[dict[str, Any]]:
        """[{hostname, gpu}] for jobs.metrics.promql.Selector.from_gpus."""
        return [{"hostname": g.hostname, "gpu": g.index} for g in self.gpus]


_EXTRA_METRICS = {
    "fb_reserved": "DCGM_FI_DEV_FB_RESERVED",
    "enc_util": "DCGM_FI_DEV_ENC_UTIL",
    "dec_util": "DCGM_FI_DEV_DEC_UTIL",
}


def _disabled_keys(names: Iterable[str]) -> set[str]:
    out = set()
    for n in names:
        if n in SIGNALS or n in _EXTRA_METRICS:
            out.add(n)
            continue
        sig = signal_for_metric(n)
        if sig is None:
            raise ValueError(f"unknown field to disable: {n!r}")
        out.add(sig.key)
    return out


def _gpus(spec: SimSpec) -> list[SimGpu]:
    n_hosts = math.ceil(spec.gpus / spec.gpus_per_host)
    hosts = list(spec.hosts) or [f"gpu-node-{i + 1:03d}" for i in range(n_hosts)]
    if len(hosts) < n_hosts:
        raise ValueError(f"{spec.gpus} GPUs at {spec.gpus_per_host} per host need {n_hosts} hosts")
    if spec.host_label not in HOST_LABEL_NAMES or spec.uuid_label not in ("UUID", "uuid"):
        raise ValueError(f"host_label must be one of {HOST_LABEL_NAMES}, uuid_label UUID or uuid")
    out = []
    for n in range(spec.gpus):
        host, idx = hosts[n // spec.gpus_per_host], spec.first_gpu + n % spec.gpus_per_host
        uuid = gpu_uuid(host, idx)
        labels = {
            "gpu": str(idx),
            spec.uuid_label: uuid,
            "pci_bus_id": pci_bus_id(idx),
            "device": f"nvidia{idx}",
            "modelName": spec.gpu_model,
            spec.host_label: host,
            "DCGM_FI_DRIVER_VERSION": spec.driver_version,
        }
        if n < len(spec.mig):
            labels |= {"GPU_I_ID": spec.mig[n][0], "GPU_I_PROFILE": spec.mig[n][1]}
        if spec.job_id is not None and spec.job_labels == "hpc_job":
            labels["hpc_job"] = spec.job_id
        elif spec.job_id is not None and spec.job_labels == "kubernetes":
            labels |= {
                "container": "pytorch",
                "namespace": spec.namespace,
                "pod": f"{spec.job_id}-worker-{hosts.index(host)}",
            }
        out.append(SimGpu(host, idx, uuid, labels))
    return out


def simulate(spec: SimSpec) -> SimResult:
    """Simulate one job's exporter fields and throughput. Same spec (seed included) -> same output."""
    if spec.scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {spec.scenario!r}; known: {', '.join(SCENARIOS)}")
    if spec.gpus < 1 or spec.step_s <= 0 or spec.duration_s < spec.step_s:
        raise ValueError("need gpus >= 1, step_s > 0 and duration_s >= step_s")
    if not 0.0 <= spec.missing_fraction < 1.0 or spec.noise < 0:
        raise ValueError("missing_fraction must be in [0, 1) and noise >= 0")
    if spec.workload is not None:
        spec = replace(spec, step_s=(spec.exporter or Exporter()).scrape_s)
    model = gpu_model(spec.gpu_model)
    gpus = _gpus(spec)
    n_t = int(spec.duration_s // spec.step_s) + 1
    ts = spec.start + spec.step_s * np.arange(n_t)
    host_names = list(dict.fromkeys(g.hostname for g in gpus))
    host_index = np.array([host_names.index(g.hostname) for g in gpus])
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, _stable_hash(spec.scenario)]))
    ctx = Ctx(rng, spec.gpus, n_t, spec.step_s, host_index, model, dict(spec.params))
    offsets = None
    extra_truth: dict[str, Any] = {}
    if spec.workload is not None:
        profile, fields, tensor_eff, offsets, extra_truth = _recorded(spec, spec.workload, ctx, model)
    else:
        profile = SCENARIOS[spec.scenario].build(ctx)
        fields, tensor_eff = _fields(profile, model, ctx, spec.noise)
    throughput = _throughput(profile, tensor_eff, model, spec)
    if spec.missing_fraction > 0:
        lost = rng.random((len(host_names), n_t)) < spec.missing_fraction
        per_gpu = lost[host_index]
        for arr in fields.values():
            arr[per_gpu] = np.nan
    for key in _disabled_keys(spec.disabled):
        fields.pop(key, None)
    if spec.mig and "gpu_util" in fields:
        fields["gpu_util"][: len(spec.mig)] = np.nan  # not reported for MIG instances
        if np.isnan(fields["gpu_util"]).all():
            fields.pop("gpu_util")
    truth: dict[str, Any] = {
        "scenario": spec.scenario,
        "code": SCENARIOS[spec.scenario].code if spec.workload is None else spec.workload.code,
        "mfu": throughput.mfu,
    }
    truth |= profile.truth | extra_truth
    for k in ("straggler_gpus", "idle_gpus"):
        if k in truth:
            truth[k.replace("_gpus", "_keys")] = [gpus[i].key for i in truth[k]]
    if "xid_gpu" in truth:
        truth["xid_key"] = gpus[truth["xid_gpu"]].key
    return SimResult(spec, model, ts, gpus, fields, throughput, truth, offsets)


def _recorded(
    spec: SimSpec, workload: Workload, ctx: Ctx, model: GpuModel
) -> tuple[Profile, dict[str, np.ndarray], np.ndarray, np.ndarray, dict[str, Any]]:
    """Fields of a step-level workload: activity fields as recorded (jobs.simulate.exporter), power,
    temperature, clocks and memory from the collect-interval activity through the scenario model."""
    exporter = spec.exporter or Exporter()
    rec = record(
        workload, exporter, n_gpus=ctx.n_gpus, host_index=ctx.host_index, n_samples=ctx.n_samples, rng=ctx.rng
    )
    clock = 0.98
    # MFU follows from the tensor work: tensor active x clock ratio is ~12 % above MFU, as in _fields.
    mfu = workload.mean("tensor") * clock / 1.12
    act = np.nan_to_num(rec.activity, nan=0.0)
    profile = Profile(
        activity=act, mfu=mfu, clock=clock, sm=workload.mean("sm") / max(workload.mean("duty"), 1e-6)
    )
    fields, _ = _fields(profile, model, ctx, spec.noise)
    lost = ~np.isfinite(rec.fields["gpu_util"])
    for arr in fields.values():
        if arr.shape == lost.shape:
            arr[lost] = np.nan  # a failed scrape loses every field of its target
    fields.update(rec.fields)
    tensor = np.nan_to_num(rec.fields["tensor_active"], nan=float(np.nanmean(rec.fields["tensor_active"])))
    return profile, fields, tensor * clock, rec.offsets, rec.truth


def simulate_cluster(specs: Sequence[SimSpec]) -> list[SimResult]:
    """Simulate several jobs; GPUs they share on a host must not overlap in time (not checked)."""
    return [simulate(s) for s in specs]


# Scenario mix of a simulated cluster: mostly busy-but-inefficient jobs, as in AcmeTrace where the median
# GPU reads 99 % util but only 50 % SM active. Weights are a plausible mix, not measured frequencies.
CLUSTER_MIX: dict[str, float] = {
    "healthy": 3, "false_saturation": 3, "data_pipeline_stall": 1, "launch_overhead": 1,
    "communication_wait": 1, "throttling": 0.5, "tensor_cores_idle": 0.5, "memory_bound": 1,
    "host_device_copy": 0.5, "straggler": 0.5, "idle_gpus": 1, "memory_headroom": 1, "gpu_errors": 0.3,
}  # fmt: skip


def cluster_specs(
    jobs: int = 12,
    *,
    seed: int = 0,
    start: float = DEFAULT_START,
    duration_s: float = 6 * 3600.0,
    step_s: float = 30.0,
    gpu_model: str = "NVIDIA H100 80GB HBM3",
    mix: dict[str, float] | None = None,
    **common: Any,
) -> list[SimSpec]:
    """Specs for a cluster of `jobs` jobs on disjoint nodes, with scenarios drawn from `mix`.

    Job sizes are 1, 2, 4 or 8 GPUs on one node, or 2-4 whole 8-GPU nodes; starts and lengths vary
    inside [start, start + duration_s]; job ids count up from 48200. `common` is passed to every SimSpec.
    """
    rng = np.random.default_rng(seed)
    weights = mix or CLUSTER_MIX
    names = list(weights)
    p = np.array([weights[n] for n in names], dtype=float)
    specs: list[SimSpec] = []
    next_node = 1
    for j in range(jobs):
        gpus = int(rng.choice([1, 2, 4, 8, 8, 16, 16, 32]))
        n_nodes = max(1, gpus // 8)
        hosts = tuple(f"gpu-node-{next_node + i:03d}" for i in range(n_nodes))
        next_node += n_nodes
        length = float(rng.uniform(0.3, 1.0)) * duration_s
        offset = float(rng.uniform(0.0, duration_s - length))
        specs.append(
            SimSpec(
                scenario=str(rng.choice(names, p=p / p.sum())),
                gpus=gpus,
                gpus_per_host=min(8, gpus),
                hosts=hosts,
                gpu_model=gpu_model,
                job_id=str(48200 + j),
                start=start + round(offset / step_s) * step_s,
                duration_s=max(step_s * 10, round(length / step_s) * step_s),
                step_s=step_s,
                seed=seed * 1000 + j,
                **common,
            )
        )
    return specs


def _stable_hash(text: str) -> int:
    # Python's hash() is salted per process; the seed must not be.
    return zlib.crc32(text.encode())


def _b(level: Any, shape: tuple[int, int]) -> np.ndarray:
    return np.broadcast_to(np.asarray(level, dtype=np.float64), shape)


def _fields(p: Profile, m: GpuModel, ctx: Ctx, noise: float) -> tuple[dict[str, np.ndarray], np.ndarray]:
    shape = (ctx.n_gpus, ctx.n_samples)
    rng = ctx.rng
    gpu_bias = 1.0 + noise * rng.standard_normal((ctx.n_gpus, 1))  # silicon and placement differ a bit

    def jitter(x: np.ndarray, rel: float = 1.0) -> np.ndarray:
        return x * gpu_bias * (1.0 + rel * noise * rng.standard_normal(shape))

    act = np.clip(_b(p.activity, shape), 0.0, 1.0)
    busy = act > 0.05
    clock_ratio = np.where(
        busy, np.clip(_b(p.clock, shape), 0.1, 1.0), m.idle_sm_clock_mhz / m.max_sm_clock_mhz
    )
    sm = np.clip(jitter(act * _b(p.sm, shape)), 0.0, 1.0)
    shape_t = act if p.tensor_shape is None else np.clip(_b(p.tensor_shape, shape), 0.0, 1.0)
    # Tensor activity x clock ratio is the hardware upper estimate of MFU; keep it ~12 % above the target.
    eff = shape_t * clock_ratio
    k = p.mfu * 1.12 / eff.mean() if eff.mean() > 0 else 0.0
    tensor = np.clip(jitter(k * shape_t), 0.0, 0.95)
    util = np.clip(np.rint(100.0 * act - np.abs(100.0 * noise * rng.standard_normal(shape))), 0, 100)
    dram = np.clip(jitter(act * _b(p.dram, shape)), 0.0, 0.85)
    power_frac = 0.15 * act + 0.45 * sm + 0.45 * tensor + 0.15 * dram + _b(p.power_extra, shape) * busy
    power = np.clip(jitter(m.idle_w + (m.tdp_w - m.idle_w) * power_frac, 0.5), m.idle_w * 0.8, m.tdp_w * 1.02)
    temp = _lagged(_b(p.ambient_c, shape) + 50.0 * power / m.tdp_w, ctx.step_s, tau_s=120.0)
    temp = np.clip(np.rint(temp + 0.5 * rng.standard_normal(shape)), 20, 95)
    # Per direction, bytes/s; no more than the model's links carry (GPUs without NVLink read 0).
    nvl_cap = m.nvlink_gbps * 1e9
    nvl = np.clip(jitter(_b(p.nvlink, shape) * busy), 0, nvl_cap)
    # RX follows TX within the noise level (noise=0 gives RX == TX, which the unit tests rely on).
    nvl_rx = np.clip(nvl * (1.0 + noise * rng.standard_normal(shape)), 0, nvl_cap)
    fb_used = np.rint(np.clip(_b(p.fb, (ctx.n_gpus, 1)), 0, 0.99) * m.fb_total_mib) * np.ones(shape)
    fb_used = np.clip(
        fb_used + np.rint(rng.normal(0, 0.002 * m.fb_total_mib, shape)) * (fb_used > 1000), 0, None
    )
    thermal = _b(p.thermal_share, shape) * busy
    power_cap = _b(p.power_share, shape) * busy
    step_ns = ctx.step_s * 1e9
    # Counters started at driver load, long before the job. Row 0 once started field 449 (wrongly read as a
    # counter); it is still drawn so that every seed keeps the random stream, and hence the data, it had.
    offsets = rng.uniform(1e9, 5e9, (4, ctx.n_gpus, 1))
    nvlink_tx, nvlink_rx = np.rint(nvl), np.rint(nvl_rx)

    f: dict[str, np.ndarray] = {
        "gpu_util": util.astype(np.float64),
        "gr_engine_active": np.clip(jitter(util / 100.0 * 0.97, 0.5), 0, 1),
        "sm_active": sm,
        "sm_occupancy": np.clip(jitter(sm * _b(p.occupancy, shape)), 0, 1),
        "tensor_active": tensor,
        "tensor_hmma_active": tensor * 0.98,
        "tensor_imma_active": np.zeros(shape),
        "tensor_dfma_active": np.zeros(shape),
        "fp16_active": np.clip(jitter(act * _b(p.fp16, shape)), 0, 1),
        "fp32_active": np.clip(jitter(act * _b(p.fp32, shape)), 0, 1),
        "fp64_active": np.clip(jitter(act * 0.001), 0, 1),
        "dram_active": dram,
        "mem_copy_util": np.clip(np.rint(dram * 100 * 0.92), 0, 100),
        "fb_used": fb_used,
        "fb_free": np.clip(m.fb_total_mib - m.fb_reserved_mib - fb_used, 0, None),
        "fb_reserved": np.full(shape, float(m.fb_reserved_mib)),
        "pcie_tx_bytes": np.rint(np.clip(jitter(2e7 + act * _b(p.pcie_tx, shape), 3), 0, None)),
        "pcie_rx_bytes": np.rint(np.clip(jitter(2e7 + act * _b(p.pcie_rx, shape), 3), 0, None)),
        "nvlink_tx_bytes": nvlink_tx,
        "nvlink_rx_bytes": nvlink_rx,
        # dcgm.md: field 449 = TX+RX over all links, an integer MB/s rate that goes up and down with traffic.
        "nvlink_bandwidth_total": np.rint((nvlink_tx + nvlink_rx) / NVLINK_TOTAL_BYTES_PER_UNIT),
        "power_usage": np.round(power, 3),
        "total_energy": np.rint(offsets[1] * 1e3 + np.cumsum(power * ctx.step_s * 1e3, axis=1)),
        "gpu_temp": temp,
        "memory_temp": np.clip(temp + 6 + np.rint(rng.normal(0, 0.5, shape)), 20, 105),
        "sm_clock": np.rint(clock_ratio * m.max_sm_clock_mhz),
        "mem_clock": np.full(shape, float(m.mem_clock_mhz)),
        "clock_throttle_reasons": np.where(busy, _b(p.throttle, shape), 0x1).astype(np.float64),
        "power_violation": np.rint(offsets[2] + np.cumsum(power_cap * step_ns, axis=1)),
        "thermal_violation": np.rint(offsets[3] + np.cumsum(thermal * step_ns, axis=1)),
        "xid_errors": np.zeros(shape) if p.xid is None else np.asarray(p.xid, dtype=np.float64),
        "enc_util": np.zeros(shape),
        "dec_util": np.zeros(shape),
    }
    f |= health_fields(ctx.n_gpus, ctx.n_samples, ctx.params)
    return f, tensor * clock_ratio


def health_fields(n_gpus: int, n_samples: int, params: dict[str, Any]) -> dict[str, np.ndarray]:
    """DCGM health fields as dcgm-exporter emits them (raw counts since driver load, 0/1 flags).

    Default-collected ones (PCIe replays, remapped rows, row-remap failure: dcgm-exporter's
    etc/default-counters.csv) are always emitted; the others only with `params["health_fields"] == "all"`
    (an operator who enabled them) or when an event names them. Counters start from a non-zero count per
    GPU (errors before the job, since driver load), so only an increase inside the job means anything.
    `params["health"]`: events {"field": key, "gpu": index, "at": fraction of the job, "count": n} add n
    to a counter from that sample on (a flag becomes 1); {"reset": true, ...} returns it to 0 (a driver
    reload). No random draws: every seed keeps the data it had.
    """
    events: list[dict[str, Any]] = list(params.get("health", ()))
    named = {str(e["field"]) for e in events}
    every = params.get("health_fields") == "all"
    out: dict[str, np.ndarray] = {}
    for key, sig in SIGNALS.items():
        if sig.group != "health" or not (sig.default_enabled or every or key in named):
            continue
        if sig.reading is Reading.CODE:
            arr = np.zeros((n_gpus, n_samples))
        else:  # a different count before the job on each GPU: 0, 2, 4, ... (PCIe replays, say)
            arr = np.repeat(2.0 * np.arange(n_gpus, dtype=np.float64)[:, None], n_samples, axis=1)
        for e in (e for e in events if e["field"] == key):
            g, t0 = int(e["gpu"]), min(int(float(e["at"]) * n_samples), n_samples - 1)
            if not 0 <= g < n_gpus:
                raise ValueError(f"health event for GPU {g}: the job has {n_gpus}")
            if e.get("reset"):
                arr[g, t0:] -= arr[g, t0]
            elif sig.reading is Reading.CODE:
                arr[g, t0:] = 1.0
            else:
                arr[g, t0:] += float(e.get("count", 1))
        out[key] = arr
    unknown = named - set(out)
    if unknown:
        raise ValueError(f"unknown health field(s): {', '.join(sorted(unknown))}")
    return out


def _lagged(target: np.ndarray, step_s: float, tau_s: float) -> np.ndarray:
    # Temperatures follow power with a thermal time constant; start at the first target.
    alpha = 1.0 - math.exp(-step_s / tau_s)
    out = np.empty_like(target)
    out[:, 0] = target[:, 0]
    for t in range(1, target.shape[1]):
        out[:, t] = out[:, t - 1] + alpha * (target[:, t] - out[:, t - 1])
    return out


def _throughput(p: Profile, tensor_eff: np.ndarray, m: GpuModel, spec: SimSpec) -> Throughput:
    # PaLM's 6N + 12·L·H·Q·T, the organisation's default convention: a job registered with this shape is
    # evaluated with the same FLOPs per token, so a simulated MFU of x is evaluated as x.
    flops_per_token = palm_flops_per_token(spec)
    peak = m.peak_bf16_tflops * 1e12
    mean_tps = p.mfu * spec.gpus * peak / flops_per_token
    w = tensor_eff.mean(axis=0)  # useful tensor work per sample drives tokens
    tps = mean_tps * w / w.mean() if w.mean() > 0 else np.zeros_like(w)
    total = np.cumsum(tps * spec.step_s)
    mfu = float(utilisation(flops_per_token, float(tps.mean()), spec.gpus * peak))
    return Throughput(tps, total, mfu, flops_per_token, peak, spec.model_params)
