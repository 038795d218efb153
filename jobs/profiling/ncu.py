"""Parse Nsight Compute CSV (`ncu --csv`) and summarise kernels by name.

Three layouts are accepted: `--page details` (long: one row per metric), `--page raw` (wide: one row per
kernel launch, the second row holds the units) and `--print-summary per-kernel` (long, with
Invocations/Minimum/Maximum/Average). `==PROF==` lines and program output before the header are ignored.
Values are normalised: times to ns, sizes to bytes, rates to bytes/s, clocks to Hz, percents kept.

Metric names follow the Nsight Compute metrics structure (Profiling Guide, "Metrics Structure" and
"Metrics Reference", docs.nvidia.com/nsight-compute/ProfilingGuide): ``unit__counter`` with a roll-up
``.sum``/``.avg``/``.min``/``.max`` and optionally a ratio ``.pct_of_peak_sustained_active`` (% of the
peak sustained rate over the unit's active cycles) or ``.pct_of_peak_sustained_elapsed`` (over elapsed
cycles); a base name given to ``--metrics`` without a roll-up is reported with all four roll-ups. The
summary reads:

* SOL throughputs (section "GPU Speed Of Light Throughput"): ``sm__throughput`` ("Compute (SM)
  Throughput"), ``gpu__compute_memory_throughput`` ("Memory Throughput": the busiest of the memory units,
  DRAM, L1 and L2 included) and ``dram__throughput`` / ``gpu__dram_throughput`` ("DRAM Throughput"), all in
  % of peak. When the memory-throughput metric is absent its stand-in is the busiest of the DRAM, L1 and L2
  throughputs present, as ncu defines it.
* Tensor pipe: ``sm__pipe_tensor_cycles_active`` (cycles the tensor pipe was active; per sub-pipe
  ``sm__pipe_tensor_op_hmma/imma/dmma/gmma_cycles_active`` on newer GPUs) and
  ``sm__inst_executed_pipe_tensor[_op_*]`` (warp instructions the tensor pipe executed). As a share: the
  ``.pct_of_peak_sustained_active/elapsed`` ratio when collected (the busiest sub-pipe), else
  ``..._cycles_active.avg`` / ``sm__cycles_elapsed.avg`` (or / "SM Active Cycles"); an instruction
  count alone says only whether the pipe ran (`tensor_pipe_instructions`).
* ncu's own verdict: the SOLBottleneck rule's text in the details page (compute, memory or latency),
  kept next to the verdict computed from the two throughputs (`bound`).
"""

from __future__ import annotations

import csv
import itertools
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobs.profiling.detect import DEFAULT_MAX_BYTES, iter_lines, open_text
from jobs.profiling.errors import ArtifactError
from jobs.profiling.guard import checkpoint, guarded
from jobs.profiling.kernel_classes import math_class
from jobs.profiling.summary_blocks import KernelTotal, tensor_cores_block

_TIME = {
    "nsecond": 1.0,
    "ns": 1.0,
    "usecond": 1e3,
    "us": 1e3,
    "msecond": 1e6,
    "ms": 1e6,
    "second": 1e9,
    "s": 1e9,
}
_BYTES = {
    "byte": 1.0,
    "b": 1.0,
    "kbyte": 1e3,
    "kb": 1e3,
    "mbyte": 1e6,
    "mb": 1e6,
    "gbyte": 1e9,
    "gb": 1e9,
    "tbyte": 1e12,
    "tb": 1e12,
    "kibyte": 1024.0,
    "kib": 1024.0,
    "mibyte": 1024.0**2,
    "mib": 1024.0**2,
    "gibyte": 1024.0**3,
    "gib": 1024.0**3,
}
_FREQ = {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9}
_PER_TIME = {
    "second": 1.0,
    "s": 1.0,
    "msecond": 1e3,
    "ms": 1e3,
    "usecond": 1e6,
    "us": 1e6,
    "nsecond": 1e9,
    "ns": 1e9,
}

# Display names (details page) and raw metric names (raw page, --metrics) for the metrics we summarise.
# A canonical key ending in a unit is only used when the value's normalised unit matches.
_CANONICAL: dict[str, tuple[str, ...]] = {
    "duration_ns": ("duration", "gpu__time_duration.sum", "gpu__time_duration.avg", "gpu__time_duration"),
    "sm_throughput_pct": (
        "compute (sm) throughput",
        "compute (sm) [%]",
        "sm [%]",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    ),
    "memory_throughput_pct": (
        "memory throughput",
        "memory [%]",
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    ),
    "memory_throughput_bytes_per_s": ("memory throughput", "dram__bytes.sum.per_second"),
    "dram_throughput_pct": (
        "dram throughput",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    ),
    "l1_throughput_pct": ("l1/tex cache throughput", "l1tex__throughput.avg.pct_of_peak_sustained_active"),
    "l2_throughput_pct": ("l2 cache throughput", "lts__throughput.avg.pct_of_peak_sustained_elapsed"),
    "achieved_occupancy_pct": ("achieved occupancy", "sm__warps_active.avg.pct_of_peak_sustained_active"),
    "theoretical_occupancy_pct": ("theoretical occupancy", "sm__maximum_warps_per_active_cycle_pct"),
    "registers_per_thread": ("registers per thread", "launch__registers_per_thread"),
    "block_size": ("block size", "launch__block_size"),
    "grid_size": ("grid size", "launch__grid_size"),
    "threads": ("threads", "launch__thread_count"),
    "waves_per_sm": ("waves per sm", "launch__waves_per_multiprocessor"),
    "sm_frequency_hz": ("sm frequency", "gpc__cycles_elapsed.avg.per_second"),
    "dram_frequency_hz": ("dram frequency", "dram__cycles_elapsed.avg.per_second"),
    "elapsed_cycles": ("elapsed cycles", "gpc__cycles_elapsed.max"),
    "sm_active_cycles": ("sm active cycles", "sm__cycles_active.avg"),
    "sm_elapsed_cycles": ("sm__cycles_elapsed.avg",),
    "dynamic_shared_memory_per_block_bytes": ("dynamic shared memory per block",),
    "static_shared_memory_per_block_bytes": ("static shared memory per block",),
    "num_sms": ("# sms", "device__attribute_multiprocessor_count"),
}
_LOOKUP: dict[str, list[str]] = {}
for _key, _names in _CANONICAL.items():
    for _name in _names:
        _LOOKUP.setdefault(_name, []).append(_key)

_IDENTITY = {
    "id": "id",
    "process id": "pid",
    "process name": "process",
    "host name": "host",
    "kernel name": "kernel",
    "function name": "kernel",
    "demangled name": "kernel",
    "context": "context",
    "stream": "stream",
    "block size": "block_dim",
    "grid size": "grid_dim",
    "device": "device",
    "cc": "cc",
    "kernel time": "kernel_time",
    "invocations": "invocations",
}
_SLUG = re.compile(r"[^a-z0-9]+")
#: Metric values beyond this magnitude are unknown; at most this many CSV columns are read.
MAX_VALUE = 1e30
MAX_COLUMNS = 4096
# Tensor-pipe metrics (see the module docstring), matched on the raw name: any roll-up, any sub-pipe.
_TENSOR_PIPE_PCT = re.compile(
    r"^sm__(?:inst_executed_)?pipe_tensor\w*\.(?:avg|max|sum)\.pct_of_peak_sustained_(active|elapsed)$"
)
_TENSOR_PIPE_CYCLES = re.compile(r"^sm__pipe_tensor\w*_cycles_active\.avg$")
_TENSOR_PIPE_INST = re.compile(r"^sm__inst_executed_pipe_tensor\w*\.sum$")
# ncu's SOLBottleneck rule texts (details page, Rule Description) and the verdict each gives.
_SOL_VERDICTS = (
    ("memory is more heavily utilized than compute", "memory"),
    ("compute is more heavily utilized than memory", "compute"),
    ("latency issues", "latency"),
    ("low compute throughput and memory bandwidth", "latency"),
    ("greater than 80.0% of the available compute or memory", "high_throughput"),
)
# ncu's own SOL rule: both throughputs below 60 % of peak point at latency, not bandwidth or compute.
LATENCY_BOUND_PCT = 60.0
BALANCED_MARGIN_PCT = 10.0


def _number(text: str) -> float | None:
    cleaned = text.strip().replace(",", "")
    if not cleaned or len(cleaned) > 64 or cleaned.lower() in {"n/a", "nan", "-nan", "inf", "-inf"}:
        return None
    try:
        value = float(cleaned)
    except ValueError:
        return None
    # NaN, infinities and magnitudes no counter reaches (1e309, 10^23 %) are unknown.
    return value if -MAX_VALUE < value < MAX_VALUE else None


def normalize_value(text: str, unit: str) -> tuple[float | str | None, str]:
    """Normalise one ncu value: ("1,234.5", "usecond") -> (1234500.0, "ns").

    Returns the value (float, or the raw string when not numeric) and its normalised unit suffix:
    "ns", "bytes", "bytes_per_s", "hz", "pct", or the tool's unit slugged.
    """
    value = _number(text)
    if value is None:
        stripped = text.strip()
        missing = not stripped or stripped.lower() in {"n/a", "nan", "-nan"}
        return (None if missing else stripped), _slug(unit) if unit.strip() != "%" else "pct"
    u = unit.strip().lower()
    if u == "%":
        return value, "pct"
    if u in _TIME:
        return value * _TIME[u], "ns"
    if u in _BYTES:
        return value * _BYTES[u], "bytes"
    if u in _FREQ:
        return value * _FREQ[u], "hz"
    if "/" in u:
        num, den = u.split("/", 1)
        if num in _BYTES and den in _PER_TIME:
            return value * _BYTES[num] * _PER_TIME[den], "bytes_per_s"
        if num == "cycle" and den in _PER_TIME:
            return value * _PER_TIME[den], "hz"
        if num in _BYTES and den == "block":
            return value * _BYTES[num], "bytes"  # "Shared Memory Per Block": the name says per block
    return value, _slug(unit)


def _slug(text: str) -> str:
    return _SLUG.sub("_", text.strip().lower()).strip("_")


def _metric_key(name: str, unit_suffix: str) -> str:
    """Canonical key for a metric, or its slug with the unit suffix when we do not know it."""
    for key in _LOOKUP.get(name.strip().lower(), []):
        wanted = key.rsplit("_", 1)[-1] if key.endswith(("_ns", "_pct", "_hz", "_bytes")) else None
        if key.endswith("_bytes_per_s"):
            wanted = "bytes_per_s"
        if wanted is None or wanted == unit_suffix:
            return key
    slug = _slug(name) or "metric"
    return f"{slug}_{unit_suffix}" if unit_suffix and not slug.endswith(unit_suffix) else slug


def _csv_lines(lines: Iterator[str], errors: list[str]) -> Iterator[str]:
    # ncu's own ==PROF== / ==WARNING== lines may appear anywhere in stdout; csv wants the line ends back.
    for line in lines:
        stripped = line.lstrip()
        if stripped.startswith("=="):
            if stripped.startswith("==ERROR==") and not errors:
                errors.append(line.strip()[:300])
            continue
        if line.strip():
            yield line + "\n"


def _read_rows(lines: Iterator[str]) -> tuple[list[str], Iterator[list[str]]]:
    """The header and a stream of the CSV rows after it (program output before the header is skipped)."""
    errors: list[str] = []
    content = _csv_lines(lines, errors)
    for line in content:
        if '"Kernel Name"' in line or '"Function Name"' in line or line.startswith('"ID",'):
            rows = csv.reader(itertools.chain([line], content))
            try:
                header = next(rows)
            except csv.Error as exc:
                raise ArtifactError(f"The ncu CSV is malformed: {exc}.") from exc
            return [cell.strip() for cell in header[:MAX_COLUMNS]], _checked(rows)
    detail = f" ncu reported: {errors[0]}" if errors else ""
    raise ArtifactError(
        'No ncu CSV header found (expected a line with "Kernel Name" from `ncu --csv --page details` '
        f"or `--page raw`).{detail}"
    )


def _checked(rows: Iterator[list[str]]) -> Iterator[list[str]]:
    try:
        for row in rows:
            checkpoint()
            yield row
    except csv.Error as exc:
        raise ArtifactError(f"The ncu CSV is malformed: {exc}.") from exc


@guarded("ncu CSV", storable=False)
def parse_ncu_csv(source: bytes | str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> list[dict[str, Any]]:
    """Parse `ncu --csv` output into one record per profiled kernel launch.

    Each record: {"id", "kernel", "block_dim", "grid_dim", "device", "cc", "stream", "instances",
    "metrics": {canonical_or_slug_with_unit: value}}, plus "tensor_counters" ({raw tensor-pipe metric name:
    value}) when the CSV has tensor-pipe metrics and "ncu_verdict" when a SOLBottleneck rule row gives
    one. Raises ArtifactError on malformed input.
    """
    with open_text(source, max_bytes, what="ncu CSV") as text:
        header, rows = _read_rows(iter_lines(text))
        lowered = [h.lower() for h in header]
        if "kernel name" not in lowered and "function name" not in lowered:
            raise ArtifactError('The ncu CSV header has no "Kernel Name" column.')
        if "metric name" in lowered and ("metric value" in lowered or "average" in lowered):
            launches = _parse_long(header, rows)
        else:
            launches = _parse_wide(header, rows)
    if not launches:
        raise ArtifactError("The ncu CSV has a header but no kernel rows.")
    return launches


def _identity(header: list[str], cells: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for title, cell in zip(header, cells, strict=False):
        key = _IDENTITY.get(title.lower())
        if key and key not in out:
            out[key] = cell.strip()
    return out


def _parse_long(header: list[str], rows: Iterator[list[str]]) -> list[dict[str, Any]]:
    col = {h.lower(): i for i, h in enumerate(header)}
    name_i, unit_i = col["metric name"], col.get("metric unit")
    value_i = col.get("metric value", col.get("average"))
    assert value_i is not None  # guaranteed by the caller's layout check
    launches: dict[tuple[str, str], dict[str, Any]] = {}
    for cells in rows:
        if len(cells) <= max(name_i, value_i):
            continue  # truncated lines
        ident = _identity(header, cells)
        key = (ident.get("id", ""), ident.get("kernel", ""))
        launch = launches.get(key)
        if launch is None:
            launch = {**ident, "metrics": {}}
            launch["instances"] = min(max(int(_number(ident.get("invocations", "")) or 1), 1), 2**40)
            launch.pop("invocations", None)
            launches[key] = launch
        if not cells[name_i].strip():
            # A rule row (empty metric name): keep ncu's own SOL verdict.
            verdict = _rule_verdict(header, cells)
            if verdict is not None:
                launch.setdefault("ncu_verdict", verdict)
            continue
        unit = cells[unit_i] if unit_i is not None and unit_i < len(cells) else ""
        value, suffix = normalize_value(cells[value_i], unit)
        metric = _metric_key(cells[name_i], suffix)
        launch["metrics"].setdefault(metric, value)
        _note_tensor(launch, cells[name_i], value, suffix)
    return list(launches.values())


def _rule_verdict(header: list[str], cells: list[str]) -> str | None:
    """ncu's verdict from a SOLBottleneck rule row of the details page, or None for other rows."""
    col = {h.lower(): i for i, h in enumerate(header)}
    rule_i, text_i = col.get("rule name"), col.get("rule description")
    if rule_i is None or text_i is None or max(rule_i, text_i) >= len(cells):
        return None
    if cells[rule_i].strip() != "SOLBottleneck":
        return None
    text = cells[text_i].lower()
    return next((verdict for phrase, verdict in _SOL_VERDICTS if phrase in text), None)


def _note_tensor(launch: dict[str, Any], name: str, value: Any, suffix: str) -> None:
    """Keep the tensor-pipe counters of a launch by their raw names (`_tensor_pipe` reads them)."""
    raw = name.strip().lower()
    if not _is_num(value) or not raw.startswith(("sm__pipe_tensor", "sm__inst_executed_pipe_tensor")):
        return
    if (
        (raw.startswith("sm__inst_executed_pipe_tensor") and raw.endswith(".sum") and suffix != "pct")
        or (suffix == "pct" and _TENSOR_PIPE_PCT.match(raw))
        or _TENSOR_PIPE_CYCLES.match(raw)
    ):
        launch.setdefault("tensor_counters", {})[raw] = float(value)


def _tensor_pipe(launch: dict[str, Any]) -> tuple[float | None, str | None, float | None]:
    """(tensor pipe active %, how it was measured, tensor-pipe warp instructions) of one launch."""
    counters: dict[str, float] = launch.get("tensor_counters", {})
    instructions = next((v for k, v in counters.items() if _TENSOR_PIPE_INST.match(k)), None)
    pcts = {k: v for k, v in counters.items() if _TENSOR_PIPE_PCT.match(k)}
    if pcts:
        # The busiest sub-pipe (hmma, imma, ...) or the whole pipe, whichever was collected.
        name = max(pcts, key=lambda k: pcts[k])
        return pcts[name], name, instructions
    cycles = {k: v for k, v in counters.items() if _TENSOR_PIPE_CYCLES.match(k)}
    metrics = launch["metrics"]
    for denominator, label in (
        ("sm_elapsed_cycles", "sm__cycles_elapsed.avg"),
        ("sm_active_cycles", "SM Active Cycles"),
    ):
        base = metrics.get(denominator)
        if cycles and _is_num(base) and base > 0:
            name = max(cycles, key=lambda k: cycles[k])
            return min(100.0, 100.0 * cycles[name] / base), f"{name} / {label}", instructions
    return None, None, instructions


def _parse_wide(header: list[str], rows: Iterator[list[str]]) -> list[dict[str, Any]]:
    first = next(rows, None)
    if first is None:
        return []
    units = ["" for _ in header]
    kernel_i = next(i for i, h in enumerate(header) if h.lower() in ("kernel name", "function name"))
    if kernel_i < len(first) and not first[kernel_i].strip():
        units = [*first, *[""] * len(header)][: len(header)]
    else:
        rows = itertools.chain([first], rows)
    launches = []
    for cells in rows:
        if len(cells) <= kernel_i or not cells[kernel_i].strip():
            continue
        launch: dict[str, Any] = {**_identity(header, cells), "metrics": {}, "instances": 1}
        for title, unit, cell in zip(header, units, cells, strict=False):
            if title.lower() in _IDENTITY or not title:
                continue
            value, suffix = normalize_value(cell, unit)
            launch["metrics"].setdefault(_metric_key(title, suffix), value)
            _note_tensor(launch, title, value, suffix)
        launches.append(launch)
    return launches


def _bound(sm: float | None, mem: float | None) -> str:
    if sm is None or mem is None:
        return "unknown"
    if max(sm, mem) < LATENCY_BOUND_PCT:
        return "latency"
    if abs(sm - mem) < BALANCED_MARGIN_PCT:
        return "balanced"
    return "memory" if mem > sm else "compute"


def _weighted(values: list[tuple[float, float]]) -> float | None:
    weight = sum(w for _, w in values)
    if values and weight > 0:
        return sum(v * w for v, w in values) / weight
    return sum(v for v, _ in values) / len(values) if values else None


def _aggregate(name: str, launches: list[dict[str, Any]]) -> dict[str, Any]:
    instances = sum(launch["instances"] for launch in launches)
    durations = [launch["metrics"].get("duration_ns") for launch in launches]
    total_ns = sum(
        d * launch["instances"] for d, launch in zip(durations, launches, strict=True) if _is_num(d)
    )
    metric_values: dict[str, list[tuple[float, float]]] = {}
    for launch, duration in zip(launches, durations, strict=True):
        weight = (duration if _is_num(duration) else 0.0) * launch["instances"]
        for key, value in launch["metrics"].items():
            if _is_num(value):
                metric_values.setdefault(key, []).append((float(value), weight))
    metrics = {key: _round(_weighted(vals)) for key, vals in metric_values.items()}
    sm, mem = metrics.get("sm_throughput_pct"), metrics.get("memory_throughput_pct")
    mem_basis = "memory_throughput_pct" if mem is not None else None
    if mem is None:
        # ncu's "Memory Throughput" is the busiest memory unit: stand in with the busiest one collected.
        parts = {k: metrics.get(k) for k in ("dram_throughput_pct", "l1_throughput_pct", "l2_throughput_pct")}
        known = {k: v for k, v in parts.items() if v is not None}
        if known:
            mem_basis = max(known, key=lambda k: known[k])
            mem = known[mem_basis]
    tensor: list[tuple[float, float]] = []
    tensor_how: str | None = None
    instructions = 0.0
    has_instructions = False
    for launch, duration in zip(launches, durations, strict=True):
        value, how, inst = _tensor_pipe(launch)
        weight = (duration if _is_num(duration) else 0.0) * launch["instances"]
        if value is not None:
            tensor.append((value, weight))
            tensor_how = tensor_how or how
        if inst is not None:
            has_instructions = True
            instructions += inst * launch["instances"]
    verdicts = Counter(str(launch["ncu_verdict"]) for launch in launches if launch.get("ncu_verdict"))
    first = launches[0]
    return {
        "kernel": name,
        "launches": instances,
        "total_duration_ms": round(total_ns / 1e6, 6) if total_ns else None,
        "avg_duration_us": round(total_ns / instances / 1e3, 4) if total_ns and instances else None,
        "sm_throughput_pct": sm,
        "memory_throughput_pct": _round(mem),
        "dram_throughput_pct": metrics.get("dram_throughput_pct"),
        "achieved_occupancy_pct": metrics.get("achieved_occupancy_pct"),
        "theoretical_occupancy_pct": metrics.get("theoretical_occupancy_pct"),
        "registers_per_thread": metrics.get("registers_per_thread"),
        "memory_throughput_basis": mem_basis,
        "tensor_pipe_active_pct": _round(_weighted(tensor)),
        "tensor_pipe_metric": tensor_how,
        "tensor_pipe_instructions": int(instructions) if has_instructions else None,
        "math_class": str(math_class(name)),
        "block_dim": first.get("block_dim"),
        "grid_dim": first.get("grid_dim"),
        "bound": _bound(sm, mem),
        "ncu_verdict": verdicts.most_common(1)[0][0] if verdicts else None,
        "metrics": metrics,
    }


def _is_num(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


@guarded("ncu CSV")
def analyze_ncu(
    source: bytes | str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES, top_n: int = 100
) -> dict[str, Any]:
    """Per kernel name: duration, SM/memory throughput, occupancy, registers, launch shape, bound class;
    plus a duration-weighted summary. Metrics absent from the CSV are None.
    """
    launches = parse_ncu_csv(source, max_bytes=max_bytes)
    by_name: dict[str, list[dict[str, Any]]] = {}
    for launch in launches:
        by_name.setdefault(launch.get("kernel") or "?", []).append(launch)
    kernels = [_aggregate(name, group) for name, group in by_name.items()]
    kernels.sort(key=lambda k: (k["total_duration_ms"] or 0.0, k["launches"]), reverse=True)
    total_ms = sum(k["total_duration_ms"] or 0.0 for k in kernels)

    def weighted(key: str) -> float | None:
        pairs = [(k[key], k["total_duration_ms"] or 0.0) for k in kernels if k[key] is not None]
        return _round(_weighted(pairs))

    bound_counts = Counter(k["bound"] for k in kernels)
    bound_time: dict[str, float] = {}
    verdict_time: dict[str, float] = {}
    for k in kernels:
        bound_time[k["bound"]] = bound_time.get(k["bound"], 0.0) + (k["total_duration_ms"] or 0.0)
        if k["ncu_verdict"]:
            verdict_time[k["ncu_verdict"]] = verdict_time.get(k["ncu_verdict"], 0.0) + (
                k["total_duration_ms"] or 0.0
            )
    tensor_cores = tensor_cores_block(
        (KernelTotal(k["kernel"], (k["total_duration_ms"] or 0.0) * 1e6, k["launches"]) for k in kernels),
        "ncu: profiled kernel durations per name",
    )
    pipe = [(k["tensor_pipe_active_pct"], k["total_duration_ms"] or 0.0) for k in kernels]
    pipe_known = [(v, w) for v, w in pipe if v is not None]
    tensor_cores["tensor_pipe_active_pct"] = _round(_weighted(pipe_known))
    tensor_cores["tensor_pipe_measured_kernels"] = len(pipe_known)
    devices = sorted({str(launch.get("device")) for launch in launches if launch.get("device")})
    return {
        "format": "ncu_csv",
        "kernel_launches": sum(launch["instances"] for launch in launches),
        "distinct_kernels": len(kernels),
        "devices": devices,
        "total_duration_ms": round(total_ms, 6) if total_ms else None,
        "duration_weighted_sm_throughput_pct": weighted("sm_throughput_pct"),
        "duration_weighted_memory_throughput_pct": weighted("memory_throughput_pct"),
        "duration_weighted_achieved_occupancy_pct": weighted("achieved_occupancy_pct"),
        "memory_bound_kernels": bound_counts.get("memory", 0),
        "compute_bound_kernels": bound_counts.get("compute", 0),
        "latency_bound_kernels": bound_counts.get("latency", 0),
        "balanced_kernels": bound_counts.get("balanced", 0),
        "unclassified_kernels": bound_counts.get("unknown", 0),
        "bound_time_share_pct": {
            name: round(100.0 * t / total_ms, 3) for name, t in sorted(bound_time.items()) if total_ms
        },
        # ncu's own SOLBottleneck verdicts (details page), as shares of the profiled kernel time.
        "ncu_verdict_time_share_pct": {
            name: round(100.0 * t / total_ms, 3) for name, t in sorted(verdict_time.items()) if total_ms
        },
        "tensor_cores": tensor_cores,
        "kernels": kernels[:top_n],
        "kernels_truncated": max(0, len(kernels) - top_n),
    }
