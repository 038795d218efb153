"""Compare our temporal and idle breakdowns with HolisticTraceAnalysis (HTA) on the sample Kineto traces.

Usage (from the repository root):

    .venv/bin/python benchmarks/hta_parity.py [--samples ../shared/samples/kineto] [--ns]

For every Kineto trace with GPU kernels it prints HTA's and our idle/compute/non-compute percentages
(temporal breakdown) and host-wait/kernel-wait/other percentages (idle breakdown, HTA's per-stream rows
summed per rank), the largest difference, and our parse and analyse time and peak Python memory (numpy
buffers included: tracemalloc sees them).

HTA is a dev-only dependency (`pip install holistictraceanalysis`). Without it the script compares with the
values HTA 0.5.0 produced on these files (recorded in `RECORDED_HTA`). `--ns` analyses at nanosecond
precision instead of rounding sub-microsecond timestamps the way HTA does.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import time
import tracemalloc
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from jobs.profiling.kineto import parse_kineto  # noqa: E402 (after the sys.path fix above)
from jobs.profiling.trace_analysis import AnalysisOptions, analyze_trace  # noqa: E402

TEMPORAL = ("idle_pct", "compute_pct", "non_compute_pct")
IDLE = ("host_wait_pct", "kernel_wait_pct", "other_pct")

#: HTA 0.5.0 (pandas 3.1.1) on the shared samples, default TraceAnalysis (last profiler step excluded),
#: consecutive_kernel_delay=30. Idle shares are HTA's per-stream idle times summed over streams. The tests
#: hold the same values (tests/unit/test_trace_analysis.py reads this file).
RECORDED_HTA: dict[str, dict[str, float]] = json.loads(
    (REPO / "tests" / "unit" / "data" / "hta_reference.json").read_text()
)


def run_hta(path: Path) -> dict[str, float] | None:
    """HTA's temporal breakdown and summed idle breakdown for one single-rank trace, or None."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return None
    logging.getLogger("hta").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analysis = TraceAnalysis(trace_files={0: str(path)}, trace_dir="/")
        tb = analysis.get_temporal_breakdown(visualize=False).iloc[0]
        out = {
            "idle_pct": 100.0 * tb["idle_time(us)"] / tb["kernel_time(us)"],
            "compute_pct": 100.0 * tb["compute_time(us)"] / tb["kernel_time(us)"],
            "non_compute_pct": 100.0 * tb["non_compute_time(us)"] / tb["kernel_time(us)"],
        }
        idle, _ = analysis.get_idle_time_breakdown(visualize=False)
        sums = idle.groupby("idle_category")["idle_time"].sum()
        total = float(sums.sum())
        if total > 0:
            for category, key in (
                ("host_wait", "host_wait_pct"),
                ("kernel_wait", "kernel_wait_pct"),
                ("other", "other_pct"),
            ):
                out[key] = 100.0 * float(sums.get(category, 0.0)) / total
    return out


def run_ours(path: Path, options: AnalysisOptions) -> tuple[dict[str, Any], float, float, float]:
    """Our analysis of rank 0, parse seconds, analyse seconds, peak traced MiB.

    Timed without tracemalloc (it slows allocation-heavy parsing severalfold), then run again under
    tracemalloc for the memory peak.
    """
    gc.collect()
    t0 = time.perf_counter()
    trace = parse_kineto(path)
    t1 = time.perf_counter()
    result = analyze_trace(trace, options)
    t2 = time.perf_counter()
    del trace
    gc.collect()
    tracemalloc.start()
    analyze_trace(parse_kineto(path), options)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return result["ranks"][0], t1 - t0, t2 - t1, peak / 2**20


def main(argv: list[str] | None = None) -> int:
    """Print the parity table; exit status 1 if any difference exceeds --tolerance points."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=Path, default=REPO.parent / "shared" / "samples" / "kineto")
    parser.add_argument("--ns", action="store_true", help="nanosecond precision (no HTA-style rounding)")
    parser.add_argument("--recorded", action="store_true", help="compare with RECORDED_HTA, do not run HTA")
    parser.add_argument("--tolerance", type=float, default=1.0, help="allowed difference, percentage points")
    args = parser.parse_args(argv)
    if not args.samples.is_dir():
        print(f"{args.samples} is absent: no sample traces to compare.")
        return 0
    options = AnalysisOptions(hta_us_rounding=not args.ns)
    try:
        from importlib.metadata import version

        hta_label = f"HTA {version('holistictraceanalysis')}"
    except ImportError:
        hta_label = "HTA (not installed: recorded 0.5.0 values)"
    if args.recorded:
        hta_label = "HTA 0.5.0 (recorded)"
    print(f"Reference: {hta_label}; ours: {'nanosecond precision' if args.ns else 'HTA us rounding'}\n")
    header = f"{'trace':38} {'metric':16} {'HTA':>9} {'ours':>9} {'diff':>7}"
    print(header)
    print("-" * len(header))
    worst = 0.0
    timings: list[tuple[str, int, float, float, float, float]] = []
    for path in sorted(args.samples.glob("*.json*")):
        if path.name.endswith("_expected.json"):
            continue  # the TensorBoard plugin's golden output: the input trace plus counters
        ours, t_parse, t_analyse, peak = run_ours(path, options)
        if not ours["has_gpu_kernels"]:
            continue
        t_hta = time.perf_counter()
        hta = None if args.recorded else run_hta(path)
        t_hta = time.perf_counter() - t_hta if hta is not None else float("nan")
        timings.append((path.name, ours["counts"]["gpu_ops"], t_parse, t_analyse, peak, t_hta))
        hta = hta if hta is not None else RECORDED_HTA.get(path.name, {})
        for key in TEMPORAL + IDLE:
            section = "temporal_breakdown" if key in TEMPORAL else "idle_breakdown"
            mine = ours[section][key]
            ref = hta.get(key)
            if mine is None and ref is None:
                continue
            diff = abs(mine - ref) if mine is not None and ref is not None else float("nan")
            if diff == diff:
                worst = max(worst, diff)
            fmt = lambda v: f"{v:9.3f}" if v is not None else f"{'-':>9}"  # noqa: E731
            print(f"{path.name[:38]:38} {key:16} {fmt(ref)} {fmt(mine)} {diff:7.3f}")
    print(f"\nMax difference: {worst:.4f} percentage points (tolerance {args.tolerance})\n")
    print(f"{'trace':38} {'gpu ops':>8} {'parse s':>8} {'analyse s':>9} {'peak MiB':>9} {'HTA s':>7}")
    for name, n, tp, ta, peak, th in timings:
        print(f"{name[:38]:38} {n:8d} {tp:8.3f} {ta:9.3f} {peak:9.1f} {th:7.2f}")
    print("\nHTA s: HTA 0.5.0 loading the trace plus its temporal and idle breakdowns (pandas).")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
