"""Mutation score of the pure math/evaluation modules (a benchmark, not a test: prints numbers, exits 0).

mutmut (the ``mutation`` extra: ``pip install -e ".[mutation]"``) is configured in pyproject's
``[tool.mutmut]``: it mutates jobs/evaluation/costs.py, kpis.py, evaluate.py, schema.py and checks.py (the
input checks costs and flops share), and runs only the pure unit tests (no database) against each mutant.

    .venv/bin/python benchmarks/mutation.py           # fresh run: removes mutants/ first
    .venv/bin/python benchmarks/mutation.py --reuse   # keep mutants/ and mutmut's cached verdicts
    .venv/bin/python benchmarks/mutation.py --list    # also print every surviving mutant's name

One worker only (``--max-children 1``): the benchmark shares a small machine. Inspect a survivor with
``.venv/bin/mutmut show <name>``. score = killed / (total - skipped).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTMUT = Path(sys.executable).with_name("mutmut")


def _mutmut(*args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(MUTMUT), *args], cwd=ROOT, text=True, capture_output=capture, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reuse", action="store_true", help="keep mutants/ and mutmut's cached results")
    parser.add_argument(
        "--list", action="store_true", help="print the name and status of every non-killed mutant"
    )
    args = parser.parse_args()

    if not MUTMUT.exists():
        print(f"mutmut not found next to {sys.executable}: pip install -e '.[mutation]'")
        return 0
    if not args.reuse:
        shutil.rmtree(ROOT / "mutants", ignore_errors=True)

    started = time.monotonic()
    run = _mutmut("run", "--max-children", "1", capture=True)
    elapsed = time.monotonic() - started
    if run.returncode != 0:
        print(run.stdout[-4000:])
        print(run.stderr[-4000:])
        print(f"mutmut run exited {run.returncode}; no score")
        return 0

    results = _mutmut("results", "--all", "true", capture=True)
    statuses: dict[str, str] = {}
    for line in results.stdout.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep:
            statuses[name] = status
    counts = collections.Counter(statuses.values())
    by_module: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for name, status in statuses.items():
        module = name.split(".x_", 1)[0].split(".x\u01c1", 1)[0]
        by_module[module][status] += 1

    total = len(statuses)
    killed = counts["killed"]
    skipped = counts["skipped"]
    scored = total - skipped
    print(f"mutmut run: {elapsed:.0f} s (1 worker)")
    print(f"mutants total: {total}")
    for status in ("killed", "survived", "timeout", "skipped", "no tests", "suspicious", "segfault"):
        print(f"  {status}: {counts[status]}")
    others = {
        s: n
        for s, n in counts.items()
        if s not in ("killed", "survived", "timeout", "skipped", "no tests", "suspicious", "segfault")
    }
    for status, n in sorted(others.items()):
        print(f"  {status}: {n}")
    score = killed / scored if scored else float("nan")
    print(f"score = killed / (total - skipped) = {killed}/{scored} = {score:.1%}")
    print("per module (killed/total, survived):")
    for module, c in sorted(by_module.items()):
        print(f"  {module}: {c['killed']}/{sum(c.values())}, {c['survived']} survived")
    if args.list:
        for name, status in sorted(statuses.items()):
            if status != "killed":
                print(f"  {status}: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
