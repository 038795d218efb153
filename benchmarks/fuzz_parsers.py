"""The long parser fuzz run: clean / unexpected / hang counts and peak memory per input byte, per format.

Usage (from the repository root; needs ../shared/samples for the real seeds):

    .venv/bin/python benchmarks/fuzz_parsers.py [--cases 2000] [--seed 1] [--formats kineto,ncu]
                                                 [--hang-s 30] [--no-memory] [--no-fuzz]

Each case is one mutated or generated artifact (the generators and mutations of
tests/unit/test_parser_fuzz.py, with the large real seeds too) run through
`jobs.intake.artifacts.analyze_file`
in a worker process; a case still running after --hang-s seconds is a hang (the worker is killed and
replaced). Outcomes: clean (a storable analysis), refused (ArtifactError: a clear message for a bad file),
unexpected (any other exception, a ParserBug, or an analysis that `safe_json.storable_problems` rejects).

Memory: each format's parser runs once on a large, valid input (a real sample or a scaled-up generated
one) in a fresh process; tracemalloc's peak (Python and numpy allocations) and the growth of the
process' peak RSS are divided by the input's size (decompressed). Target (issue 13): at most 4x.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import multiprocessing as mp
import os
import random
import resource
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "efficiency.settings")

from tests.unit import test_parser_fuzz as fz  # noqa: E402


def _setup() -> None:
    import django

    django.setup()


def _worker(conn: Connection) -> None:
    _setup()
    while True:
        job = conn.recv()
        if job is None:
            return
        path, kind = job
        outcome = fz.run_case(Path(path), kind)
        conn.send((outcome.status, outcome.detail, outcome.seconds))


class Runner:
    """One worker process; replaced when a case hangs."""

    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self._start()

    def _start(self) -> None:
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker, args=(child,), daemon=True)
        self.proc.start()

    def run(self, path: Path, kind: str, limit_s: float) -> tuple[str, str, float]:
        self.conn.send((str(path), kind))
        if self.conn.poll(limit_s):
            try:
                return self.conn.recv()
            except EOFError:
                pass
            self._restart()
            return ("unexpected", "worker died (killed for memory?)", limit_s)
        self._restart()
        return ("hang", f"over {limit_s:.0f} s", limit_s)

    def _restart(self) -> None:
        self.proc.kill()
        self.proc.join()
        self._start()

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(5)


# ---------------------------------------------------------------------------------------------------
# Large valid inputs for the memory figures.


def _scaled_text(gen: Any, target_bytes: int, seed: int) -> bytes:
    rng = random.Random(seed)
    parts: list[bytes] = []
    size = 0
    first = True
    while size < target_bytes:
        data = gen(rng)
        if not first:
            # Keep one header: drop the lines before the first data row of later chunks.
            data = b"\n".join(data.split(b"\n")[2:])
        parts.append(data)
        size += len(data)
        first = False
    return b"".join(parts)


def _clean_numbers(gen: Any) -> Any:
    def wrapped(rng: random.Random) -> bytes:
        saved = list(fz.EDGE_NUMBERS)
        fz.EDGE_NUMBERS[:] = ["12.5"]
        try:
            return gen(rng)
        finally:
            fz.EDGE_NUMBERS[:] = saved

    return wrapped


def _big_nvidia_smi(target: int) -> bytes:
    seed = (fz.SAMPLES / "nvidia-smi" / "nanogpt_8gpu_util_power.csv").read_bytes()
    head, _, body = seed.partition(b"\n")
    return head + b"\n" + body * max(1, target // len(body))


def _big_speedscope(target: int) -> bytes:
    import json

    doc = json.loads((fz.SAMPLES / "pyspy" / "pyspy_bpe_tokenizer.speedscope.json").read_bytes())
    size = len(json.dumps(doc))
    times = max(1, target // size)
    for prof in doc["profiles"]:
        if "samples" in prof:
            prof["samples"] = prof["samples"] * times
            prof["weights"] = prof["weights"] * times
            prof["endValue"] = prof.get("endValue", 0) * times
    return json.dumps(doc).encode()


def _big_dstat(target: int) -> bytes:
    rng = random.Random(3)
    head = fz.gen_dstat(random.Random(8)).split(b"\n")[:7]
    rows = []
    size = 0
    t0 = 1715679000
    i = 0
    while size < target:
        row = f"{t0 + i}," + ",".join(f"{rng.uniform(0, 100):.3f}" for _ in range(13)) + ","
        rows.append(row.encode())
        size += len(row) + 1
        i += 1
    return b"\n".join([*head, *rows]) + b"\n"


def _big_pyspy_raw(target: int) -> bytes:
    # A real raw profile is one line per distinct stack over a bounded set of functions, and stacks share
    # their callers: walk a fixed call graph (3,000 functions, 3 callees each) to random depths.
    rng = random.Random(4)
    pool = [f"fn_{i} (pkg/mod_{i % 97}.py:{i % 400 + 1})" for i in range(3000)]
    seen: set[str] = set()
    lines = []
    size = 0
    while size < target:
        node = 0
        stack = ['process 4242:"python train.py"', 'thread (0x7F00): "MainThread"']
        for _ in range(rng.randint(4, 40)):
            node = (node * 31 + rng.randrange(3) + 1) % len(pool)
            stack.append(pool[node])
        text = ";".join(stack)
        if text in seen:
            continue
        seen.add(text)
        line = f"{text} {rng.randint(1, 500)}"
        lines.append(line)
        size += len(line) + 1
    return ("\n".join(lines) + "\n").encode()


def _big_ncu(target: int) -> bytes:
    # `ncu --csv --page details`: one row per metric, 36 metrics per launch, unique launch ids.
    rng = random.Random(2)
    cols = (
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
        '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
    )
    sol = "GPU Speed Of Light Throughput"
    metrics = [
        (sol, "Duration", "usecond"),
        (sol, "Compute (SM) Throughput", "%"),
        (sol, "Memory Throughput", "%"),
        (sol, "DRAM Throughput", "%"),
        (sol, "Elapsed Cycles", "cycle"),
        (sol, "SM Frequency", "cycle/nsecond"),
        *[("Occupancy", f"Metric {i}", "%") for i in range(30)],
    ]
    names = [
        "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, T2, T3)",
        "reduce_kernel",
    ]
    lines = ["==PROF== Connected to process 5120 (/usr/bin/python3)", cols]
    size, kid = 0, 0
    while size < target:
        name = rng.choice(names)
        for section, metric, unit in metrics:
            line = (
                f'"{kid}","5120","python3","node","{name}","1","7","(128, 1, 1)","(1024, 1, 1)","0","9.0",'
                f'"{section}","{metric}","{unit}","{rng.uniform(0, 100):.2f}"'
            )
            lines.append(line)
            size += len(line) + 1
        kid += 1
    return ("\n".join(lines) + "\n").encode()


def _big_nsys(seed: Path, target: int, tmp: Path) -> Path:
    # The real 2x H100 export with its event tables repeated (shifted in time) until the file is `target`.
    import shutil
    import sqlite3

    out = tmp / "big-nsys.sqlite"
    shutil.copyfile(seed, out)
    os.chmod(out, 0o644)
    con = sqlite3.connect(out)
    tables = [
        r[0]
        for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")
        if r[0].startswith(("CUPTI_ACTIVITY_KIND_", "NVTX_EVENTS"))
    ]
    lo, hi = 2**62, 0
    for table in tables:
        cols = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
        if "start" in cols and "end" in cols:
            a, b = con.execute(f'SELECT min(start), max("end") FROM "{table}"').fetchone()
            if a is not None and b is not None:
                lo, hi = min(lo, a), max(hi, b)
    span = hi - lo + 1
    k = 1
    while out.stat().st_size < target and k < 1000:
        for table in tables:
            cols = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
            if "start" not in cols:
                continue
            exprs = [
                f'"{c}" + {k * span}' if c in ("start", "end") else ("NULL" if c == "id" else f'"{c}"')
                for c in cols
            ]
            con.execute(
                f'INSERT INTO "{table}" ({", ".join(chr(34) + c + chr(34) for c in cols)}) '
                f'SELECT {", ".join(exprs)} FROM "{table}" WHERE start <= {hi}'
            )
        con.commit()
        k += 1
    con.execute("VACUUM")
    con.close()
    return out


def memory_inputs(target: int, tmp: Path) -> dict[str, tuple[str, bytes | Path]]:
    inputs: dict[str, tuple[str, bytes | Path]] = {}
    k = fz.SAMPLES / "kineto" / "hta_v100_2rank_rank1.json.gz"
    if k.exists():
        inputs["kineto"] = ("kineto", k)
    n = fz.SAMPLES / "nsys" / "nsysai_h100_2gpu_train_300ms.sqlite"
    if n.exists():
        inputs["nsys_sqlite"] = ("nsys_sqlite", _big_nsys(n, target, tmp))
    inputs["nsys_stats"] = ("nsys_stats_csv", _scaled_text(_clean_numbers(fz.gen_nsys_stats), target, 1))
    inputs["ncu"] = ("ncu_csv", _big_ncu(target))
    inputs["pyspy_raw"] = ("pyspy_raw", _big_pyspy_raw(target))
    if (fz.SAMPLES / "pyspy").is_dir():
        inputs["speedscope"] = ("pyspy_speedscope", _big_speedscope(target))
    if (fz.SAMPLES / "nvidia-smi").is_dir():
        inputs["nvidia_smi"] = ("nvidia_smi_csv", _big_nvidia_smi(target))
    inputs["dstat"] = ("dstat_csv", _big_dstat(target))
    return inputs


def _peak_rss_bytes() -> int:
    # VmHWM, not getrusage's ru_maxrss: a spawned child's ru_maxrss starts at the parent's peak (Linux
    # carries it across the fork and exec), which would hide the parse behind the benchmark's own size.
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _measure(path: str, kind: str, traced: bool, conn: Connection) -> None:
    import tracemalloc

    _setup()
    from jobs.intake.artifacts import analyze_file
    from jobs.profiling import kineto, monitoring, ncu, nsys, nsys_stats, pyspy, trace_analysis  # noqa: F401

    # Imported before the baseline: numpy's and the parsers' own code is not the parse's memory.
    rss0 = _rss_bytes()
    if traced:
        tracemalloc.start()
    start = time.perf_counter()
    try:
        analyze_file(path, kind)
        status = "ok"
    except Exception as exc:  # reported, not raised: the figure is still interesting
        status = f"{type(exc).__name__}: {str(exc)[:120]}"
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1] if traced else 0
    conn.send((peak, max(0, _peak_rss_bytes() - rss0), seconds, status))


def _child(path: Path, kind: str, traced: bool) -> tuple[int, int, float, str]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_measure, args=(str(path), kind, traced, child))
    proc.start()
    result: tuple[int, int, float, str] = parent.recv()
    proc.join()
    return result


def measure_memory(name: str, kind: str, source: bytes | Path, tmp: Path) -> dict[str, Any]:
    """Peak memory of one parse: tracemalloc's peak (Python and numpy allocations) in one fresh process,
    the growth of peak RSS (everything: SQLite, allocator slack) in another, without tracemalloc."""
    if isinstance(source, Path):
        path = source
        raw = source.read_bytes()
        size = len(gzip.decompress(raw)) if raw[:2] == b"\x1f\x8b" else len(raw)
    else:
        path = tmp / f"mem-{name}"
        path.write_bytes(source)
        size = len(source)
    peak, _, _, status = _child(path, kind, True)
    _, rss, seconds, _ = _child(path, kind, False)
    return {"bytes": size, "traced_x": peak / size, "rss_x": rss / size, "seconds": seconds, "status": status}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", type=int, default=2000, help="cases per format")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--formats", default="", help="comma-separated subset")
    parser.add_argument("--hang-s", type=float, default=30.0)
    parser.add_argument("--memory-mb", type=float, default=20.0, help="size of the generated memory inputs")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--no-fuzz", action="store_true")
    parser.add_argument("--show", type=int, default=5, help="unexpected outcomes to print per format")
    args = parser.parse_args()

    fmts = fz.formats(large=True)
    wanted = [f for f in (args.formats.split(",") if args.formats else sorted(fmts)) if f]
    memory: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="fuzz-bench-") as tmpdir:
        tmp = Path(tmpdir)
        if not args.no_memory:
            for name, (kind, source) in memory_inputs(int(args.memory_mb * 1e6), tmp).items():
                if name in wanted:
                    memory[name] = measure_memory(name, kind, source, tmp)
        results: dict[str, collections.Counter[str]] = {}
        examples: dict[str, collections.Counter[str]] = {}
        slowest: dict[str, float] = {}
        if not args.no_fuzz:
            runner = Runner()
            for name in wanted:
                fmt = fmts[name]
                if not fmt.seeds and fmt.generate is None:
                    continue
                counts: collections.Counter[str] = collections.Counter()
                sigs: collections.Counter[str] = collections.Counter()
                started = time.perf_counter()
                for path in fz.cases(fmt, args.cases, args.seed, tmp):
                    status, detail, seconds = runner.run(path, fmt.kind, args.hang_s)
                    counts[status] += 1
                    slowest[name] = max(slowest.get(name, 0.0), seconds)
                    if status in ("unexpected", "unstorable", "hang"):
                        sigs[f"{status}: {detail[:160]}"] += 1
                results[name] = counts
                examples[name] = sigs
                print(f"# {name}: {args.cases} cases in {time.perf_counter() - started:.0f} s", flush=True)
            runner.close()

    header = (
        f"{'format':12} {'cases':>6} {'clean':>6} {'refused':>7} {'unexpected':>10} {'hangs':>5} "
        f"{'slowest s':>9} {'mem input':>10} {'traced/B':>8} {'rss/B':>6}"
    )
    print(header)
    print("-" * len(header))
    for name in wanted:
        c = results.get(name, collections.Counter())
        m = memory.get(name)
        unexpected = c["unexpected"] + c["unstorable"]
        mem = (
            f"{m['bytes'] / 1e6:9.1f}M {m['traced_x']:8.2f} {m['rss_x']:6.2f}"
            if m
            else f"{'-':>10} {'-':>8} {'-':>6}"
        )
        print(
            f"{name:12} {sum(c.values()):6} {c['clean']:6} {c['refused']:7} {unexpected:10} {c['hang']:5} "
            f"{slowest.get(name, 0.0):9.2f} {mem}"
        )
    for name in wanted:
        m = memory.get(name)
        if m and m["status"] != "ok":
            print(f"memory input for {name}: {m['status']}")
        for sig, n in examples.get(name, collections.Counter()).most_common(args.show):
            print(f"{name}: {n} x {sig}")


if __name__ == "__main__":
    main()
