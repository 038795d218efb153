"""Kineto parse + analyse speed and peak memory against HolisticTraceAnalysis (HTA), on scaled real traces.

Usage (from the repository root):

    .venv/bin/python benchmarks/parse_speed.py [--sizes 25,50,100,200] [--repeat 3]
        [--hta-python /tmp/hta-venv/bin/python] [--base ../shared/samples/kineto/hta_v100_2rank_rank1.json.gz]

Traces of the given sizes (MB, 10^6 bytes) are made from a real sample by replicating its events with
shifted timestamps, correlation ids, External ids and ProfilerStep numbers (whole copies, the last one cut
by time), one event per line, and written to a temporary directory. For each size, in the same run:

* ours: `parse_kineto` + `analyze_trace` (what the worker runs), in a fresh process per repetition;
  wall seconds of the two calls and the peak resident memory growth over the process' RSS just before
  parsing (VmHWM - VmRSS from /proc, so numpy buffers, the read buffers and the decoder's objects all
  count; no tracemalloc, which slows parsing severalfold);
* HTA: `TraceAnalysis` loading the trace plus its temporal and idle breakdowns, run by `--hta-python`
  (a separate virtual environment: `python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install
  holistictraceanalysis==0.5.0`), measured the same way (its CPU includes its parsing pool's workers;
  its peak is its main process' only, so it is a lower bound). Without it only our numbers are printed.

Prints min and median over the repetitions. The numbers depend on the machine and on its load.

`--end-to-end` (issue 26 item 5) measures instead what a user waits for: a fresh process per run, from
the interpreter's start to its exit, for both line layouts of each size (one event per line, and the same
trace written as one line, as some exporters do):

* ours: `manage.py analyze_artifact TRACE --json` (stdout discarded), exactly as a user types it, and the
  same through Django (`-v 1` makes manage.py set Django up first, as every run did before issue 26);
* HTA: a script that imports `hta` and runs the same load + temporal + idle breakdowns.

Wall seconds, CPU seconds (user + system of the process and the children it waited for, GNU time) and
peak RSS (ru_maxrss of the whole process, interpreter and imports included, as a multiple of the file),
with the 1-minute load average beside each row. Every command runs with bytecode caching on, as in a
user's shell (`user_env`), after one unmeasured run of ours that compiles it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BASE = REPO.parent / "shared" / "samples" / "kineto" / "hta_v100_2rank_rank1.json.gz"

#: Run in a child: read the peak RSS growth of one parse + analysis of argv[1].
OURS_CHILD = r"""
import sys, time, json
sys.path.insert(0, sys.argv[2])
from jobs.profiling.kineto import parse_kineto
from jobs.profiling.trace_analysis import analyze_trace

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0

base = status("VmRSS")
t0, c0 = time.perf_counter(), time.process_time()
result = analyze_trace(parse_kineto(sys.argv[1]))
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
rank = result["ranks"][0]
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_bytes": status("VmHWM") - base,
                  "idle_pct": rank["temporal_breakdown"]["idle_pct"], "gpu_ops": rank["counts"]["gpu_ops"]}))
"""

HTA_CHILD = r"""
import os, sys, time, json, logging, warnings
warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
from importlib.metadata import version
logging.getLogger("hta").setLevel(logging.ERROR)

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0

def cpu_s():
    # HTA parses in a multiprocessing pool: its (joined) workers' CPU counts too.
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system

base = status("VmRSS")
t0, c0 = time.perf_counter(), cpu_s()
analysis = TraceAnalysis(trace_files={0: sys.argv[1]}, trace_dir="/")
tb = analysis.get_temporal_breakdown(visualize=False).iloc[0]
analysis.get_idle_time_breakdown(visualize=False)
wall, cpu = time.perf_counter() - t0, cpu_s() - c0
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_bytes": status("VmHWM") - base,
                  "idle_pct": 100.0 * tb["idle_time(us)"] / tb["kernel_time(us)"],
                  "version": version("holistictraceanalysis")}))
"""


#: HTA as a user runs it: a script, timed from outside (imports included).
HTA_SCRIPT = r"""
import sys, logging, warnings
warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
logging.getLogger("hta").setLevel(logging.ERROR)
analysis = TraceAnalysis(trace_files={0: sys.argv[1]}, trace_dir="/")
analysis.get_temporal_breakdown(visualize=False)
analysis.get_idle_time_breakdown(visualize=False)
"""


def _timed(argv: list[str], env: dict[str, str] | None = None) -> dict[str, float]:
    """Run `argv` to completion (stdout discarded) under GNU time: wall s, CPU s and peak RSS bytes of the
    process and the children it waited for (HTA's parsing pool). GNU time, not our own wait4: a child
    forked from this process starts with this process' resident pages (the base trace) in its maxrss."""
    t0 = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%U %S %M", *argv], cwd=REPO, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, check=False, env=env)  # fmt: skip
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:3]} failed: {proc.stderr[-2000:]}")
    user, system, max_kib = proc.stderr.strip().splitlines()[-1].split()
    return {"wall_s": wall, "cpu_s": float(user) + float(system), "rss_bytes": float(max_kib) * 1024}


def one_line_copy(path: Path, out: Path) -> int:
    """The same trace with every newline dropped (json.dumps escapes newlines inside strings, so each one
    in the file is between tokens); returns the bytes written."""
    written = 0
    with path.open("rb") as src, out.open("wb") as dst:
        while chunk := src.read(1 << 22):
            chunk = chunk.replace(b"\n", b"")
            dst.write(chunk)
            written += len(chunk)
    return written


def user_env(pycache: Path) -> dict[str, str]:
    """The environment a user's shell gives the command: Python caches compiled bytecode. A sandbox or CI
    that sets PYTHONDONTWRITEBYTECODE makes every run of ours compile each of our modules again (~45 ms
    a run), while HTA's bytecode was compiled when pip installed it; the cache goes to `pycache`
    (PYTHONPYCACHEPREFIX), not into the checkout."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def end_to_end(
    paths: list[tuple[str, Path, int]], repeat: int, hta: str | None, hta_repeat: int, env: dict[str, str]
) -> None:
    """Print, per trace, ours (`manage.py analyze_artifact --json`) and HTA's script, each a fresh process."""
    for layout, path, size in paths:
        command = [sys.executable, "manage.py", "analyze_artifact", str(path), "--json"]
        _timed(command, env)  # unmeasured: compiles our bytecode once, as a user's first run does
        ours = [_timed(command, env) for _ in range(repeat)]
        line = (
            f"{size / 1e6:6.1f} MB {layout:<14} ours (manage.py): wall {_med(ours, 'wall_s'):6.2f} s"
            f" cpu {_med(ours, 'cpu_s'):6.2f} s peak RSS {_med(ours, 'rss_bytes') / 2**20:6.0f} MiB"
            f" ({_med(ours, 'rss_bytes') / size:4.2f}x file)"
        )
        if hta:
            theirs = [_timed([hta, "-c", HTA_SCRIPT, str(path)], env) for _ in range(hta_repeat)]
            line += (
                f" | HTA script: wall {_med(theirs, 'wall_s'):6.2f} s cpu {_med(theirs, 'cpu_s'):6.2f} s"
                f" peak RSS {_med(theirs, 'rss_bytes') / 2**20:6.0f} MiB"
                f" | ratio wall {_med(theirs, 'wall_s') / _med(ours, 'wall_s'):5.1f}x"
                f" cpu {_med(theirs, 'cpu_s') / _med(ours, 'cpu_s'):5.1f}x"
            )
        print(f"{line}  [load {os.getloadavg()[0]:4.1f}]", flush=True)
        # The same command through Django (`-v 1` is one of Django's own options): how it ran before
        # manage.py parsed without Django (settings, every app, the Celery app and its tasks first).
        # Settings need a SECRET_KEY unless DEBUG: a development checkout's default, as `make` sets it.
        django_env = {"DEBUG": "true", **env}
        django = [_timed([*command, "-v", "1"], django_env) for _ in range(repeat)]
        print(f"{'':9} {'':<14} through Django (before): wall {_med(django, 'wall_s'):6.2f} s"
              f" cpu {_med(django, 'cpu_s'):6.2f} s peak RSS {_med(django, 'rss_bytes') / 2**20:6.0f} MiB"
              f"  [load {os.getloadavg()[0]:4.1f}]", flush=True)  # fmt: skip


def _med(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _load(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc: dict[str, Any] = json.loads(raw)
    return doc


def make_trace(base: dict[str, Any], target_bytes: int, out: Path) -> int:
    """Write a trace of about `target_bytes` replicating `base`'s events; returns the bytes written."""
    events = [e for e in base["traceEvents"] if isinstance(e, dict)]
    timed = sorted((e for e in events if isinstance(e.get("ts"), int | float)), key=lambda e: e["ts"])
    untimed = [e for e in events if not isinstance(e.get("ts"), int | float)]
    spans = [e for e in timed if e.get("cat") == "Trace"]
    timed = [e for e in timed if e.get("cat") != "Trace"]
    t_min = timed[0]["ts"]
    t_max = max(e["ts"] + (e.get("dur") or 0) for e in timed)
    period = (t_max - t_min) + 1000.0  # a millisecond between copies
    ids = [
        v
        for e in timed
        for v in (
            (e.get("args") or {}).get("correlation"),
            (e.get("args") or {}).get("External id"),
            e.get("id"),
        )
        if isinstance(v, int) and not isinstance(v, bool)
    ]
    id_shift = (max(ids) + 1) if ids else 0
    steps = [
        int(e["name"].split("#")[1])
        for e in timed
        if isinstance(e.get("name"), str) and e["name"].startswith("ProfilerStep#")
    ]
    step_shift = (max(steps) + 1) if steps else 0
    head = {k: v for k, v in base.items() if k not in ("traceEvents", "traceName")}
    written = 0
    with out.open("w") as handle:
        text = json.dumps(head)[:-1] + ', "traceEvents": [\n'
        handle.write(text)
        written += len(text)
        first = True
        copy = 0
        end_ts = t_max
        while written < target_bytes:
            for e in timed:
                e2 = dict(e)
                e2["ts"] = e["ts"] + copy * period
                args = e.get("args")
                if isinstance(args, dict):
                    args = dict(args)
                    for key in ("correlation", "External id"):
                        if isinstance(args.get(key), int):
                            args[key] += copy * id_shift
                    e2["args"] = args
                if isinstance(e.get("id"), int):
                    e2["id"] = e["id"] + copy * id_shift
                if isinstance(e.get("name"), str) and e["name"].startswith("ProfilerStep#"):
                    e2["name"] = f"ProfilerStep#{int(e['name'].split('#')[1]) + copy * step_shift}"
                line = ("" if first else ",\n") + json.dumps(e2)
                first = False
                handle.write(line)
                written += len(line)
                end_ts = max(end_ts, e2["ts"] + (e2.get("dur") or 0))
                if written >= target_bytes:
                    break
            copy += 1
        for e in untimed:
            line = ",\n" + json.dumps(e)
            handle.write(line)
            written += len(line)
        for e in spans:  # the profiler's span covers every copy
            e2 = dict(e, dur=end_ts - e["ts"])
            line = ",\n" + json.dumps(e2)
            handle.write(line)
            written += len(line)
        tail = '\n], "traceName": "scaled"}\n'
        handle.write(tail)
        written += len(tail)
    return written


def _run(python: str, code: str, path: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [python, "-c", code, str(path), str(REPO)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{python} failed on {path.name}: {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    """Print the speed/memory table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="25,50,100,200", help="trace sizes in MB (10^6 bytes)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hta-repeat", type=int, default=1, help="HTA runs per size (it is slow)")
    parser.add_argument("--hta-python", default="/tmp/hta-venv/bin/python")
    parser.add_argument("--base", type=Path, default=DEFAULT_BASE)
    parser.add_argument("--keep", type=Path, help="write the traces here instead of a temporary directory")
    parser.add_argument(
        "--end-to-end", action="store_true",
        help="time manage.py analyze_artifact and an HTA script as whole processes, both line layouts",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not args.base.is_file():
        print(f"{args.base} is absent: no sample trace to scale.")
        return 0
    hta = args.hta_python if args.hta_python and os.access(args.hta_python, os.X_OK) else None
    base = _load(args.base)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for mb in sizes:
            path = folder / f"scaled_{mb}mb.json"
            size = make_trace(base, mb * 10**6, path)
            if args.end_to_end:
                flat = folder / f"scaled_{mb}mb_one_line.json"
                flat_size = one_line_copy(path, flat)
                end_to_end([("event per line", path, size), ("one line", flat, flat_size)],
                           args.repeat, hta, args.hta_repeat, user_env(Path(tmp) / "pycache"))  # fmt: skip
                if not args.keep:
                    path.unlink()
                    flat.unlink()
                continue
            ours = [_run(sys.executable, OURS_CHILD, path) for _ in range(args.repeat)]
            theirs = [_run(hta, HTA_CHILD, path) for _ in range(args.hta_repeat)] if hta else []
            rows.append((mb, size, ours, theirs))
            _print_row(mb, size, ours, theirs)
            if not args.keep:
                path.unlink()
    print()
    print("wall: seconds of parse + analysis (HTA: TraceAnalysis load + temporal + idle breakdown);")
    print("peak: resident memory growth during them (VmHWM - VmRSS before), as a multiple of the file;")
    print("cpu: median process CPU seconds (user + system) of the same calls: steadier on a shared machine.")
    print("speedup: HTA's median / our median. Times are min/median over the repetitions.")
    return 0


def _print_row(mb: int, size: int, ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> None:
    def stats(runs: list[dict[str, Any]], key: str) -> tuple[float, float]:
        values = [float(r[key]) for r in runs]
        return min(values), statistics.median(values)

    if mb == 0:
        return
    ow_min, ow_med = stats(ours, "wall_s")
    op_min, op_med = stats(ours, "peak_bytes")
    line = (
        f"{mb:>4} MB ({size / 1e6:6.1f} MB, {ours[0]['gpu_ops']:>8} GPU ops)"
        f"  ours wall {ow_min:6.2f}/{ow_med:6.2f} s cpu {stats(ours, 'cpu_s')[1]:6.2f} s"
        f"  peak {op_min / 2**20:7.1f}/{op_med / 2**20:7.1f} MiB ({op_med / size:4.2f}x)"
    )
    if theirs:
        hw_min, hw_med = stats(theirs, "wall_s")
        _, hp_med = stats(theirs, "peak_bytes")
        _, hc_med = stats(theirs, "cpu_s")
        _, oc_med = stats(ours, "cpu_s")
        line += (
            f"  | HTA {theirs[0]['version']} wall {hw_min:6.2f}/{hw_med:6.2f} s"
            f" cpu {stats(theirs, 'cpu_s')[1]:6.2f} s"
            f"  peak {hp_med / 2**20:7.1f} MiB ({hp_med / size:4.2f}x)"
            f"  speedup wall {hw_med / ow_med:5.1f}x cpu {hc_med / oc_med:5.1f}x"
            f"  idle% ours {ours[0]['idle_pct']:.3f} HTA {theirs[0]['idle_pct']:.3f}"
        )
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
