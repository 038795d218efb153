"""Fuzzing the artifact parsers: every input ends in an analysis that can be stored, or in `ArtifactError`.

A seeded mutator (no hypothesis: it is not a dependency) over the real files in ../shared/samples and
over inputs generated from the documented formats for the tools without a real sample here (ncu --csv,
nsys stats *_sum CSV, py-spy raw, dstat CSV): byte flips, truncation, numeric tokens replaced by
1e309 / -1 / 2^63 / 10^23 / NaN, huge strings, NUL bytes, lone surrogates, deep nesting, duplicated
blocks, wrong JSON types; SQL-level damage for the Nsight Systems exports (edge values in random cells,
undecodable text, dropped tables). Each case goes through `jobs.intake.artifacts.analyze_file`, the pipeline's
entry point, and must finish within a time limit.

`benchmarks/fuzz_parsers.py` runs the long version (thousands of cases, hang detection in a child
process, peak memory per input byte) with the same generators.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import random
import re
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLES = REPO_ROOT.parent / "shared" / "samples"
DATA = Path(__file__).resolve().parent / "data"

EDGE_NUMBERS = [
    "1e309",
    "-1e309",
    "-1",
    "9223372036854775808",
    "-9223372036854775809",
    "100000000000000000000000",
    "1e23",
    "NaN",
    "nan",
    "inf",
    "-Infinity",
    "0",
    "-0",
    "1e-320",
    "18446744073709551616",
    "4294967296",
    "2147483648",
    "9" * 400,
    "0x7fffffffffffffff",
    "1,000,000,000,000,000,000,000",
]
_NUMBER_RE = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


# --------------------------------------------------------------------------------------------------
# Generated inputs for the formats without a real sample (from the formats documented in
# ../shared/reference/formats.md).


def _num(rng: random.Random) -> str:
    if rng.random() < 0.15:
        return rng.choice(EDGE_NUMBERS)
    return rng.choice(
        [str(rng.randint(0, 10**9)), f"{rng.uniform(0, 1e6):.3f}", f"{rng.uniform(0, 100):.1f}"]
    )


def _kernel_name(rng: random.Random) -> str:
    return rng.choice(
        [
            "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn",
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, T2, T3)",
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm *, unsigned long, ncclWork *)",
            "reduce_kernel",
            'flash_fwd_kernel<"quoted", 128>',
        ]
    )


def gen_ncu(rng: random.Random) -> bytes:
    """`ncu --csv --page details` (long) or `--page raw` (wide) output."""
    lines = ["==PROF== Connected to process 5120 (/usr/bin/python3)"]
    if rng.random() < 0.6:
        cols = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
        cols += '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
        lines.append(cols)
        metrics = [
            ("GPU Speed Of Light Throughput", "Duration", "usecond"),
            ("GPU Speed Of Light Throughput", "Compute (SM) Throughput", "%"),
            ("GPU Speed Of Light Throughput", "Memory Throughput", "%"),
            ("GPU Speed Of Light Throughput", "DRAM Throughput", "%"),
            ("Occupancy", "Achieved Occupancy", "%"),
            ("Launch Statistics", "Registers Per Thread", "register/thread"),
            ("Memory Workload Analysis", "Memory Throughput", "Gbyte/second"),
            ("GPU Speed Of Light Throughput", "Elapsed Cycles", "cycle"),
        ]
        for kid in range(rng.randint(1, 12)):
            name = _kernel_name(rng).replace('"', '""')
            for section, metric, unit in metrics:
                lines.append(
                    f'"{kid}","5120","python3","node","{name}","1","7","(128, 1, 1)","(1024, 1, 1)","0",'
                    f'"9.0","{section}","{metric}","{unit}","{_num(rng)}"'
                )
    else:
        names = [
            "gpu__time_duration.sum",
            "sm__throughput.avg.pct_of_peak_sustained_elapsed",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed",
            "launch__registers_per_thread",
        ]
        lines.append(
            '"ID","Process ID","Process Name","Host Name","Kernel Name",' + ",".join(f'"{n}"' for n in names)
        )
        lines.append('"","","","","",' + ",".join(f'"{u}"' for u in ["nsecond", "%", "%", "register/thread"]))
        for kid in range(rng.randint(1, 20)):
            name = _kernel_name(rng).replace('"', '""')
            lines.append(
                f'"{kid}","5120","python3","node","{name}",' + ",".join(f'"{_num(rng)}"' for _ in names)
            )
    lines.append("==PROF== Disconnected from process 5120")
    return ("\n".join(lines) + "\n").encode()


_STATS = "Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns)"
_NSYS_REPORTS = {
    "cuda_gpu_kern_sum": f"Time (%),Total Time (ns),Instances,{_STATS},Name",
    "cuda_api_sum": f"Time (%),Total Time (ns),Num Calls,{_STATS},Name",
    "cuda_gpu_mem_time_sum": f"Time (%),Total Time (ns),Count,{_STATS},Operation",
    "cuda_gpu_mem_size_sum": "Total (MB),Count,Avg (MB),Med (MB),Min (MB),Max (MB),StdDev (MB),Operation",
    "nvtx_sum": f"Time (%),Total Time (ns),Instances,{_STATS},Style,Range",
    "cuda_gpu_trace": "Start (ns),Duration (ns),CorrId,GrdX,GrdY,GrdZ,BlkX,BlkY,BlkZ,Reg/Trd,StcSMem (MB),"
    "DymSMem (MB),Bytes (MB),Throughput (MBps),SrcMemKd,DstMemKd,Device,Ctx,Strm,Name",
}
_LABELS = {
    "cuda_gpu_mem_time_sum": ["[CUDA memcpy Host-to-Device]", "[CUDA memcpy HtoD]", "[CUDA memset]"],
    "cuda_gpu_mem_size_sum": ["[CUDA memcpy Device-to-Host]", "[CUDA memcpy DtoD]"],
    "nvtx_sum": ["PushPop,:forward", "StartEnd,:data_wait"],
    "cuda_api_sum": ["cudaLaunchKernel", "cudaMemcpyAsync", "cudaStreamSynchronize"],
}


def gen_nsys_stats(rng: random.Random) -> bytes:
    """`nsys stats --format csv` stdout: several *_sum reports between "Processing [...]" lines."""
    out = ["Generating SQLite file report1.sqlite from report1.nsys-rep"]
    for report in rng.sample(sorted(_NSYS_REPORTS), rng.randint(1, len(_NSYS_REPORTS))):
        out.append(f"Processing [report1.sqlite] with [/opt/nsys/reports/{report}.py]... ")
        if rng.random() < 0.1:
            out.append(f"SKIPPED: report1.sqlite does not contain {report} data.")
            continue
        out.append(f"\n ** Report ({report}):\n")
        header = _NSYS_REPORTS[report]
        out.append(header)
        ncols = header.count(",")
        for _ in range(rng.randint(1, 15)):
            if report == "cuda_gpu_trace":
                cells = [_num(rng) for _ in range(ncols)]
                cells[-1] = '"' + _kernel_name(rng).replace('"', '""') + '"'
            else:
                label = rng.choice(_LABELS.get(report, [_kernel_name(rng).replace('"', '""')]))
                cells = [_num(rng) for _ in range(ncols - label.count(","))] + [f'"{label}"']
            out.append(",".join(cells))
        out.append("")
    return ("\n".join(out) + "\n").encode()


def _frame(rng: random.Random) -> str:
    func = rng.choice(["<module>", "main", "forward", "backward", "__next__", "_worker_loop", "get", "wait"])
    file = rng.choice(
        ["train.py", "torch/nn/modules/module.py", "torch/utils/data/dataloader.py", "queue.py"]
    )
    return f"{func} ({file}:{rng.randint(1, 2000)})"


def gen_pyspy_raw(rng: random.Random) -> bytes:
    """`py-spy record --format raw`: `frame;frame;... COUNT` per line, optional process/thread frames."""
    lines = []
    for _ in range(rng.randint(1, 40)):
        stack = [_frame(rng) for _ in range(rng.randint(1, 12))]
        if rng.random() < 0.4:
            stack.insert(0, f'thread (0x{rng.randint(1, 2**48):X}): "MainThread"')
        if rng.random() < 0.3:
            stack.insert(0, f'process {rng.randint(1, 99999)}:"python train.py"')
        lines.append(";".join(stack) + f" {_num(rng) if rng.random() < 0.3 else rng.randint(1, 500)}")
    return ("\n".join(lines) + "\n").encode()


def gen_dstat(rng: random.Random) -> bytes:
    """dstat --output CSV (0.7.2 or 0.7.3 style): metadata lines, group row, column row, samples."""
    v073 = rng.random() < 0.5
    lines = [
        f'"Dstat {"0.7.3" if v073 else "0.7.2"} CSV output"',
        '"Author:","Dag Wieers <dag@wieers.com>",,,,"URL:","http://dag.wieers.com/home-made/dstat/"',
        '"Host:","gpu-node-07",,,,"User:","alice"',
        '"Cmdline:","dstat -tcmdn --output dstat.csv 5",,,,"Date:","14 May 2024 09:30:00 UTC"',
        "",
    ]
    if v073:
        lines.append('"epoch","total cpu usage",,,,,"memory usage",,,,"dsk/total",,"net/total",')
        cols = [
            "epoch:epoch",
            "total cpu usage:usr",
            "total cpu usage:sys",
            "total cpu usage:idl",
            "total cpu usage:wai",
            "total cpu usage:stl",
            "memory usage:used",
            "memory usage:free",
            "memory usage:buff",
            "memory usage:cach",
            "dsk/total:read",
            "dsk/total:writ",
            "net/total:recv",
            "net/total:send",
        ]
        lines.append(",".join(f'"{c}"' for c in cols) + ",")
    else:
        lines.append('"system","total cpu usage",,,,,,"memory usage",,,,"dsk/total",,"net/total",')
        cols = [
            "time",
            "usr",
            "sys",
            "idl",
            "wai",
            "hiq",
            "siq",
            "used",
            "buff",
            "cach",
            "free",
            "read",
            "writ",
            "recv",
            "send",
        ]
        lines.append(",".join(f'"{c}"' for c in cols))
    t0 = 1715679000
    for i in range(rng.randint(1, 60)):
        stamp = f"{t0 + 5 * i}" if v073 else f"14-05 09:{30 + i // 12:02d}:{(5 * i) % 60:02d}"
        cells = [stamp] + [_num(rng) for _ in cols[1:]]
        lines.append(",".join(cells) + ("," if v073 else ""))
    return ("\n".join(lines) + "\n").encode()


def gen_nvidia_smi(rng: random.Random) -> bytes:
    """`nvidia-smi --query-gpu=... --format=csv` with units."""
    header = "timestamp, name, index, utilization.gpu [%], utilization.memory [%], memory.used [MiB], "
    header += "power.draw [W]"
    lines = [header]
    for s in range(rng.randint(1, 30)):
        for gpu in range(rng.randint(1, 4)):
            vals = [
                f"{_num(rng)} %",
                f"{_num(rng)} %",
                f"{_num(rng)} MiB",
                rng.choice([f"{_num(rng)} W", "[N/A]"]),
            ]
            lines.append(
                f"2024/05/14 09:30:{s % 60:02d}.{rng.randint(0, 999):03d}, NVIDIA H100 80GB HBM3, {gpu}, "
                + ", ".join(vals)
            )
    return ("\n".join(lines) + "\n").encode()


# --------------------------------------------------------------------------------------------------
# Mutations.


def _mutate_numbers(data: bytes, rng: random.Random) -> bytes:
    spans = [m.span() for m in _NUMBER_RE.finditer(data, 0, min(len(data), 4 << 20))]
    if not spans:
        return data
    picks = sorted(rng.sample(spans, min(len(spans), rng.choice([1, 3, 20, 200]))), reverse=True)
    out = bytearray(data)
    for a, b in picks:
        out[a:b] = rng.choice(EDGE_NUMBERS).encode()
    return bytes(out)


def _flip(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.choice([1, 4, 32])):
        if out:
            out[rng.randrange(len(out))] = rng.randrange(256)
    return bytes(out)


def _truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data) + 1)] if data else data


def _insert(data: bytes, rng: random.Random, blob: bytes) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + blob + data[at:]


def _huge_string(data: bytes, rng: random.Random) -> bytes:
    # Inside a quoted or unquoted field when it lands on one: a name of a million characters.
    quotes = [m.start() + 1 for m in re.finditer(rb'"', data[: 1 << 20])]
    at = rng.choice(quotes) if quotes and rng.random() < 0.7 else rng.randrange(len(data) + 1)
    return data[:at] + b"A" * rng.choice([5000, 300_000]) + data[at:]


def _nul(data: bytes, rng: random.Random) -> bytes:
    return _insert(data, rng, rng.choice([b"\x00", b"\\u0000", b"\x00" * 10]))


def _surrogate(data: bytes, rng: random.Random) -> bytes:
    quotes = [m.start() + 1 for m in re.finditer(rb'"', data[: 1 << 20])]
    at = rng.choice(quotes) if quotes else rng.randrange(len(data) + 1)
    blob = rng.choice([b"\\ud800", b"\\udfff\\ud800", b"\xed\xa0\x80", b"\xff\xfe"])
    return data[:at] + blob + data[at:]


def _nesting(data: bytes, rng: random.Random) -> bytes:
    depth = rng.choice([100, 5000, 200_000])
    blob = b"[" * depth + b"]" * depth
    colons = [m.end() for m in re.finditer(rb'":\s*', data[: 1 << 20])]
    if colons:
        at = rng.choice(colons)
        end = at
        while end < len(data) and data[end : end + 1] not in (b",", b"}", b"]"):
            end += 1
        return data[:at] + blob + data[end:]
    return _insert(data, rng, blob)


def _duplicate(data: bytes, rng: random.Random) -> bytes:
    lines = data.split(b"\n")
    if len(lines) < 3:
        return data + data
    a = rng.randrange(len(lines))
    b = min(len(lines), a + rng.randint(1, 50))
    block = lines[a:b]
    times = rng.choice([2, 10, 100])
    block_bytes = sum(len(x) + 1 for x in block)
    times = max(1, min(times, (4 << 20) // max(1, block_bytes)))
    return b"\n".join(lines[:b] + block * times + lines[b:])


def _delete_lines(data: bytes, rng: random.Random) -> bytes:
    lines = data.split(b"\n")
    for _ in range(rng.randint(1, 5)):
        if lines:
            del lines[rng.randrange(len(lines))]
    return b"\n".join(lines)


def _wrong_types(data: bytes, rng: random.Random) -> bytes:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return _flip(data, rng)
    nodes: list[tuple[Any, Any]] = []

    def walk(node: Any, depth: int) -> None:
        if depth > 12 or len(nodes) > 20000:
            return
        if isinstance(node, dict):
            for k, v in node.items():
                nodes.append((node, k))
                walk(v, depth + 1)
        elif isinstance(node, list):
            for i, v in enumerate(node[:500]):
                nodes.append((node, i))
                walk(v, depth + 1)

    walk(doc, 0)
    if not nodes:
        return data
    replacements: list[Any] = [
        None,
        True,
        "",
        "x" * 100,
        "12",
        -1,
        2**63,
        10**23,
        1.5,
        [],
        {},
        [1, 2],
        {"a": 1},
        "NaN",
        -(2**63) - 1,
    ]
    for _ in range(rng.choice([1, 5, 50])):
        parent, key = rng.choice(nodes)
        with contextlib.suppress(IndexError, KeyError, TypeError):
            parent[key] = rng.choice(replacements)
    return json.dumps(doc).encode()


TEXT_MUTATIONS: list[Callable[[bytes, random.Random], bytes]] = [
    _mutate_numbers,
    _mutate_numbers,
    _mutate_numbers,
    _flip,
    _truncate,
    _huge_string,
    _nul,
    _surrogate,
    _duplicate,
    _delete_lines,
]
JSON_MUTATIONS = [*TEXT_MUTATIONS, _nesting, _wrong_types, _wrong_types]


def mutate_text(data: bytes, rng: random.Random, *, json_like: bool = False) -> bytes:
    """One to three mutations of a text artifact."""
    pool = JSON_MUTATIONS if json_like else TEXT_MUTATIONS
    for _ in range(rng.choice([1, 1, 2, 3])):
        data = rng.choice(pool)(data, rng)
    return data


_SQL_EDGE: list[Any] = [
    None,
    -1,
    2**63 - 1,
    -(2**63),
    1e308,
    float("inf"),
    float("-inf"),
    float("nan"),
    1e23,
    "text",
    "",
    "A" * 100_000,
    b"\xff\xfe\x00",
    "\x00",
    0,
    4294967295,
]


def mutate_sqlite(seed: Path, out: Path, rng: random.Random) -> None:
    """A damaged copy of an SQLite export: SQL-level edits to random cells and tables, or byte damage."""
    shutil.copyfile(seed, out)
    os.chmod(out, 0o644)
    if rng.random() < 0.25:
        data = out.read_bytes()
        data = rng.choice([_flip, _truncate, _duplicate])(data, rng)
        out.write_bytes(data)
        return
    con = sqlite3.connect(out)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for _ in range(rng.choice([1, 3, 10])):
            table = rng.choice(tables)
            quoted = table.replace('"', '""')
            cols = [r[1] for r in con.execute(f'PRAGMA table_info("{quoted}")')]
            action = rng.random()
            if action < 0.05:
                con.execute(f'DROP TABLE "{quoted}"')
                tables.remove(table)
                if not tables:
                    break
                continue
            if not cols:
                continue
            col = rng.choice(cols).replace('"', '""')
            if action < 0.1:
                con.execute(f'UPDATE "{quoted}" SET "{col}" = CAST(X\'C328FF\' AS TEXT)')
                continue
            if action < 0.15:
                con.execute(f'INSERT INTO "{quoted}" SELECT * FROM "{quoted}" LIMIT 1000')
                continue
            value = rng.choice(_SQL_EDGE)
            where = rng.choice(["", " WHERE rowid % 7 = 0", " WHERE rowid = (SELECT min(rowid) FROM t)"])
            where = where.replace("FROM t", f'FROM "{quoted}"')
            con.execute(f'UPDATE "{quoted}" SET "{col}" = ?{where}', (value,))
        con.commit()
    except sqlite3.Error:
        pass
    finally:
        con.close()


# --------------------------------------------------------------------------------------------------
# Formats and cases.


@dataclass(frozen=True)
class Format:
    """One artifact kind: its seed files, its generator (if any) and how to mutate it."""

    name: str
    kind: str
    seeds: tuple[Path, ...]
    generate: Callable[[random.Random], bytes] | None = None
    json_like: bool = False
    gzip_seeds: bool = False
    sqlite: bool = False
    small: bool = False  # cut the seeds (CI)


def _existing(*paths: Path) -> tuple[Path, ...]:
    return tuple(p for p in paths if p.exists())


# Small seeds only in CI, so a few hundred cases per format fit in the time budget; the benchmark adds
# the large ones with `large=True`.
def formats(*, large: bool = False) -> dict[str, Format]:
    kineto = sorted((SAMPLES / "kineto").glob("*")) if (SAMPLES / "kineto").is_dir() else []
    small_kineto = [p for p in kineto if p.stat().st_size < 130_000]
    return {
        "kineto": Format(
            "kineto", "kineto", tuple(kineto if large else small_kineto), json_like=True, gzip_seeds=True
        ),
        "nsys_sqlite": Format(
            "nsys_sqlite",
            "nsys_sqlite",
            _existing(
                SAMPLES / "nsys" / "nsysai_minimal_rtx3080.sqlite",
                *([SAMPLES / "nsys" / "nsysai_h100_2gpu_train_300ms.sqlite"] if large else []),
            ),
            sqlite=True,
        ),
        "nsys_stats": Format(
            "nsys_stats",
            "nsys_stats_csv",
            _existing(
                DATA / "nsys_stats_stdout_2024.txt",
                DATA / "nsys_stats_2021_column.txt",
                DATA / "run1_cuda_gpu_kern_sum.csv",
                DATA / "run1_cuda_gpu_trace.csv",
            ),
            generate=gen_nsys_stats,
        ),
        "ncu": Format(
            "ncu",
            "ncu_csv",
            _existing(DATA / "ncu_details_2022.csv", DATA / "ncu_details_2024.csv", DATA / "ncu_raw.csv"),
            generate=gen_ncu,
        ),
        "pyspy_raw": Format(
            "pyspy_raw",
            "pyspy_raw",
            _existing(DATA / "pyspy_train_plain.txt", DATA / "pyspy_train_subprocesses.txt"),
            generate=gen_pyspy_raw,
        ),
        "speedscope": Format(
            "speedscope",
            "pyspy_speedscope",
            _existing(SAMPLES / "pyspy" / "pyspy_bpe_tokenizer.speedscope.json"),
            json_like=True,
            small=not large,
        ),
        "nvidia_smi": Format(
            "nvidia_smi",
            "nvidia_smi_csv",
            _existing(SAMPLES / "nvidia-smi" / "nanogpt_8gpu_util_power.csv", DATA / "nvidia_smi_units.csv"),
            generate=gen_nvidia_smi,
            small=not large,
        ),
        "dstat": Format(
            "dstat",
            "dstat_csv",
            _existing(DATA / "dstat_0.7.2.csv", DATA / "dstat_0.7.3.csv"),
            generate=gen_dstat,
        ),
    }


_seed_cache: dict[tuple[Path, bool], bytes] = {}
#: In CI the larger real seeds are cut to this many CSV lines / speedscope samples per profile, so a
#: few hundred cases per format fit in the time budget (the benchmark mutates them whole).
_CI_LINES = 300
_CI_SAMPLES = 300


def _shrink(path: Path, data: bytes) -> bytes:
    if data.lstrip()[:1] == b"{" and b'"profiles"' in data[:4096]:
        doc = json.loads(data)
        for prof in doc.get("profiles", []):
            for key in ("samples", "weights"):
                if isinstance(prof.get(key), list):
                    prof[key] = prof[key][:_CI_SAMPLES]
        return json.dumps(doc).encode()
    if path.suffix == ".csv":
        return b"\n".join(data.split(b"\n")[:_CI_LINES]) + b"\n"
    return data


def _seed_bytes(path: Path, small: bool = False) -> bytes:
    if (path, small) not in _seed_cache:
        data = path.read_bytes()
        data = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
        _seed_cache[(path, small)] = _shrink(path, data) if small else data
    return _seed_cache[(path, small)]


def make_case(fmt: Format, index: int, seed: int, workdir: Path) -> Path:
    """Write case `index` of `fmt` under `workdir` and return its path (deterministic in `seed`)."""
    rng = random.Random(f"{seed}:{fmt.name}:{index}")
    out = workdir / f"{fmt.name}-{index}"
    if fmt.sqlite:
        mutate_sqlite(rng.choice(fmt.seeds), out.with_suffix(".sqlite"), rng)
        return out.with_suffix(".sqlite")
    use_generated = fmt.generate is not None and (not fmt.seeds or rng.random() < 0.5)
    if use_generated:
        assert fmt.generate is not None
        data = fmt.generate(rng)
        if rng.random() < 0.8:
            data = mutate_text(data, rng, json_like=fmt.json_like)
    else:
        data = mutate_text(_seed_bytes(rng.choice(fmt.seeds), fmt.small), rng, json_like=fmt.json_like)
    if fmt.gzip_seeds and rng.random() < 0.3:
        data = gzip.compress(data, compresslevel=1)
        if rng.random() < 0.2:
            data = _truncate(data, rng)
    out.write_bytes(data)
    return out


def cases(fmt: Format, count: int, seed: int, workdir: Path) -> Iterator[Path]:
    for i in range(count):
        path = make_case(fmt, i, seed, workdir)
        yield path
        path.unlink(missing_ok=True)


@dataclass
class Outcome:
    status: str  # "clean" (analysis), "refused" (ArtifactError), "unexpected", "unstorable"
    detail: str
    seconds: float


def run_case(path: Path, kind: str) -> Outcome:
    """Run one case through the pipeline's entry point and classify the result."""
    from jobs.intake.artifacts import analyze_file
    from jobs.profiling import errors
    from jobs.profiling.errors import ArtifactError
    from jobs.profiling.safe_json import storable_problems

    ParserBug = getattr(errors, "ParserBug", ())

    start = time.perf_counter()
    try:
        analysis = analyze_file(path, kind)
    except ParserBug as exc:
        return Outcome("unexpected", f"ParserBug: {exc}", time.perf_counter() - start)
    except ArtifactError as exc:
        return Outcome("refused", str(exc)[:200], time.perf_counter() - start)
    except Exception as exc:
        return Outcome("unexpected", f"{type(exc).__name__}: {str(exc)[:200]}", time.perf_counter() - start)
    elapsed = time.perf_counter() - start
    problems = storable_problems(analysis)
    if problems:
        return Outcome("unstorable", "; ".join(problems[:3]), elapsed)
    return Outcome("clean", "", elapsed)


# --------------------------------------------------------------------------------------------------
# The CI part: a few hundred cases per format, each under a time limit.

CI_CASES = int(os.environ.get("FUZZ_CASES", "250"))
CI_SEED = int(os.environ.get("FUZZ_SEED", "20261201"))
CASE_LIMIT_S = 10.0


@pytest.mark.shared
@pytest.mark.parametrize("name", sorted(formats()))
def test_fuzzed_inputs_end_in_an_analysis_or_artifact_error(name: str) -> None:
    fmt = formats()[name]
    if not fmt.seeds and fmt.generate is None:
        pytest.skip(f"no seed files for {name} ({SAMPLES} is absent)")
    failures: list[str] = []
    slow: list[str] = []
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{name}-") as tmp:
        for i, path in enumerate(cases(fmt, CI_CASES, CI_SEED, Path(tmp))):
            outcome = run_case(path, fmt.kind)
            if outcome.status in ("unexpected", "unstorable"):
                failures.append(f"case {i}: {outcome.status}: {outcome.detail}")
            if outcome.seconds > CASE_LIMIT_S:
                slow.append(f"case {i}: {outcome.seconds:.1f} s")
    assert not failures, f"{len(failures)} of {CI_CASES} {name} cases: " + "\n".join(failures[:10])
    assert not slow, f"{name} cases over {CASE_LIMIT_S} s: " + ", ".join(slow[:10])


def _nested(depth: int) -> list[Any]:
    out: list[Any] = []
    for _ in range(depth):
        out = [out]
    return out


def test_storable_helper_finds_each_problem() -> None:
    from jobs.profiling.safe_json import make_storable, storable_problems

    bad = {
        "nan": float("nan"),
        "inf": [float("inf")],
        "big": 10**23,
        "nul": "a\x00b",
        "surrogate": "\ud800",
        1: "int key",
        "deep": _nested(70),
    }
    problems = storable_problems(bad)
    assert len(problems) == 7, problems
    fixed, changed = make_storable(bad)
    assert storable_problems(fixed) == []
    assert changed >= 7
    assert (
        fixed["nan"] is None
        and fixed["big"] is None
        and fixed["nul"] == "ab"
        and fixed["surrogate"] == "\ufffd"
    )
    assert storable_problems({"ok": [1, 2.5, "x", None, True, 2**53, -(2**53)]}) == []
    assert storable_problems({"big": 2**53 + 1}) != []


def test_guard_turns_an_unexpected_exception_into_a_parser_bug() -> None:
    from jobs.profiling.errors import ArtifactError, ParserBug
    from jobs.profiling.guard import guarded

    @guarded("test file")
    def broken(source: bytes) -> dict[str, Any]:
        raise OverflowError("cannot convert float infinity to integer")

    with pytest.raises(ParserBug, match=r"OverflowError at test_parser_fuzz\.py:\d+") as caught:
        broken(b"x")
    assert isinstance(caught.value, ArtifactError)


def test_guard_cleans_a_result_and_says_so() -> None:
    from jobs.profiling.guard import guarded
    from jobs.profiling.safe_json import storable_problems

    @guarded("test file")
    def parse(source: bytes) -> dict[str, Any]:
        return {"mean": float("nan"), "count": 10**23, "name": "a\x00b", "warnings": []}

    result = parse(b"x")
    assert storable_problems(result) == []
    assert result["mean"] is None and result["count"] is None and result["name"] == "ab"
    assert "3 value(s)" in result["warnings"][0]


def test_time_budget_stops_the_parse_with_the_budget_in_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.profiling import guard
    from jobs.profiling.errors import ArtifactError

    monkeypatch.setattr(guard, "BASE_SECONDS", 0.0)
    monkeypatch.setattr(guard, "SECONDS_PER_MIB", 0.0)

    @guard.guarded("slow file")
    def slow(source: bytes) -> dict[str, Any]:
        while True:
            guard.checkpoint()

    with pytest.raises(ArtifactError, match=r"longer than its budget of 0 s"):
        slow(b"x")


def test_memory_budget_stops_the_parse_with_the_budget_in_the_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobs.profiling import guard
    from jobs.profiling.errors import ArtifactError

    monkeypatch.setattr(guard, "BASE_MEMORY_BYTES", 1024**2)
    monkeypatch.setattr(guard, "MEMORY_PER_INPUT_BYTE", 4.0)

    @guard.guarded("big file")
    def greedy(source: bytes) -> dict[str, Any]:
        held = b"x" * (64 * 1024**2)  # touched pages: resident
        guard.check_now()
        return {"n": len(held)}

    with pytest.raises(ArtifactError, match=r"memory budget of 1 MiB \(1 MiB \+ 4x"):
        greedy(b"x" * 10)


def test_a_cell_a_column_cannot_hold_keeps_the_columns_aligned() -> None:
    from jobs.profiling.events import ColumnBuilder

    builder = ColumnBuilder({"a": "q", "b": "i", "c": "b"})
    builder.append_row(1, 2**40, 3)  # fails in the second column, after the first took its value
    builder.append_row(2**70, 5, 6)
    builder.append_row(1, 2, "x")
    cols = {k: v.tolist() for k, v in builder.to_numpy().items()}
    assert cols == {"a": [1, -1, 1], "b": [-1, 5, 2], "c": [3, 6, -1]}


def test_a_huge_processing_line_does_not_backtrack_for_minutes() -> None:
    from jobs.profiling.errors import ArtifactError
    from jobs.profiling.nsys_stats import analyze_nsys_stats

    text = (
        b"Processing [report1.sqlite] with [" + b"A" * 300_000 + b"\nTime (%),Total Time (ns),Name\n1,2,k\n"
    )
    start = time.perf_counter()
    with contextlib.suppress(ArtifactError):
        analyze_nsys_stats(text)
    assert time.perf_counter() - start < 5


def test_an_allocation_past_the_memory_budget_fails_the_parse_and_the_process_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import resource
    import threading

    from jobs.profiling import guard
    from jobs.profiling.errors import ArtifactError

    if threading.active_count() != 1:
        pytest.skip("the address-space limit is only set in a single-threaded process")
    monkeypatch.setattr(guard, "BASE_MEMORY_BYTES", 64 * 1024**2)
    monkeypatch.setattr(guard, "MEMORY_PER_INPUT_BYTE", 1.0)
    before = resource.getrlimit(resource.RLIMIT_AS)

    @guard.guarded("huge file")
    def one_big_allocation(source: bytes) -> dict[str, Any]:
        # One C-level allocation of 1 GiB, far past 64 MiB + 1x the 10-byte input; no checkpoint runs
        # inside it, so only the kernel's limit can stop it before it is made.
        held = bytearray(1024**3)
        return {"n": len(held)}

    with pytest.raises(ArtifactError, match=r"memory budget of 64 MiB \(64 MiB \+ 1x its 0\.0 MiB\)"):
        one_big_allocation(b"x" * 10)
    assert resource.getrlimit(resource.RLIMIT_AS) == before  # lifted again
    assert len(bytearray(256 * 1024**2)) == 256 * 1024**2  # the process allocates as before


def test_a_real_parse_over_its_memory_budget_fails_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.profiling import guard
    from jobs.profiling.errors import ArtifactError
    from jobs.profiling.kineto import parse_kineto

    monkeypatch.setattr(guard, "BASE_MEMORY_BYTES", 0)
    monkeypatch.setattr(guard, "MEMORY_PER_INPUT_BYTE", 0.01)
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1}
        for i in range(200_000)
    ]
    data = json.dumps({"traceEvents": events}).encode()  # ~15 MB: a budget of ~150 kB
    with pytest.raises(ArtifactError, match="memory budget"):
        parse_kineto(data)
    monkeypatch.undo()  # the usual budget again: the same file parses in the same process
    assert len(parse_kineto(data).ranks[0].cpu_ops) == 200_000
