"""Parse and analyse one artifact file, and `manage.py analyze_artifact` without Django.

`analyze_path` is the one dispatch from an artifact kind to its parser; the worker (through
`jobs.intake.artifacts.analyze_file`, which adds the configured size limit) and the command line both call it.
It imports only the parser the kind needs.

`main` is the command line. `manage.py analyze_artifact ...` runs it before Django is set up: parsing a
local file reads no model, setting or database, and Django's start-up (settings, every app's models, the
Celery app and the task modules the jobs app registers) cost 2.6 CPU-s before a parse began (issue 26),
longer than parsing a 100 MB trace. The Django command (`jobs/management/commands/analyze_artifact.py`,
still what `call_command` runs) shares `add_arguments` and `run`, so both print the same thing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from jobs.profiling.detect import (
    DSTAT_CSV,
    KINETO,
    NCU_CSV,
    NSYS_SQLITE,
    NSYS_STATS_CSV,
    NVIDIA_SMI_CSV,
    PYSPY_RAW,
    PYSPY_SPEEDSCOPE,
    REJECTED_KINDS,
    SUPPORTED_KINDS,
    detect_kind,
    read_head,
)
from jobs.profiling.errors import ArtifactError

#: The kinds `--kind` accepts, in a stable order (the same set as Artifact.Kind: tests check).
KINDS: tuple[str, ...] = tuple(sorted(SUPPORTED_KINDS))

#: ARTIFACT_MAX_DECOMPRESSED_BYTES' default, as efficiency/settings.py states it (a test keeps them equal).
DEFAULT_MAX_DECOMPRESSED_BYTES = 1024**3

#: Django's common command options: with any of them `manage.py` goes through Django as before.
DJANGO_OPTIONS = ("--settings", "--pythonpath", "--traceback", "--no-color", "--force-color", "--skip-checks",
                  "-v", "--verbosity")  # fmt: skip


class Writer(Protocol):
    """Where the command writes: sys.stdout, or the Django command's OutputWrapper."""

    def write(self, text: str, /) -> Any:
        """Write `text` (already ending with a newline)."""


class CommandFailed(Exception):
    """A refusal of the command line (no such file, a rejected or unparseable file), shown to the user."""


def analyze_path(
    path: str | Path,
    kind: str,
    *,
    max_decompressed_bytes: int,
    rank: int | None = None,
    filename: str | None = None,
    time_zone: str | None = None,
) -> dict[str, Any]:
    """Parse and analyse one artifact file of a known kind; raises ArtifactError with a user-facing reason.
    `max_decompressed_bytes`: the most bytes a compressed file may expand to. `time_zone`: the zone of a
    monitoring log's zone-less timestamps (UTC when None, stated in the result)."""
    path = Path(path)
    name = filename or path.name
    # Each branch imports its own parser: the Kineto path needs neither sqlite3 nor the CSV readers.
    if kind == KINETO:
        from jobs.profiling import kineto, trace_analysis

        return trace_analysis.analyze_trace(
            kineto.parse_kineto(path, max_decompressed_bytes=max_decompressed_bytes, rank=rank)
        )
    if kind == NSYS_SQLITE:
        from jobs.profiling import nsys, trace_analysis

        return trace_analysis.analyze_trace(nsys.parse_nsys(path))
    if kind == NSYS_STATS_CSV:
        from jobs.profiling import nsys_stats

        return nsys_stats.analyze_nsys_stats(path, max_bytes=max_decompressed_bytes, filename=name)
    if kind == NCU_CSV:
        from jobs.profiling import ncu

        return ncu.analyze_ncu(path, max_bytes=max_decompressed_bytes)
    if kind in (PYSPY_RAW, PYSPY_SPEEDSCOPE):
        from jobs.profiling import pyspy

        return pyspy.analyze_pyspy(path, max_bytes=max_decompressed_bytes, filename=name)
    if kind == NVIDIA_SMI_CSV:
        from jobs.profiling import monitoring

        return monitoring.analyze_nvidia_smi(path, max_bytes=max_decompressed_bytes, timezone=time_zone)
    if kind == DSTAT_CSV:
        from jobs.profiling import monitoring

        return monitoring.analyze_dstat(path, max_bytes=max_decompressed_bytes, timezone=time_zone)
    raise ArtifactError(f"no parser for kind {kind!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's arguments (the Django command adds the same ones to its parser)."""
    parser.add_argument("path")
    parser.add_argument("--kind", choices=KINDS, help="skip auto-detection")
    parser.add_argument("--rank", type=int, help="rank of a Kineto trace without distributedInfo")
    parser.add_argument("--json", action="store_true", help="print the whole analysis as JSON")
    parser.add_argument(
        "--timezone",
        help="zone of an nvidia-smi/dstat log's local timestamps (IANA name or +02:00; UTC if omitted)",
    )


def run(opts: dict[str, Any], out: Writer, *, max_decompressed_bytes: int) -> None:
    """Analyse `opts["path"]` and write the summary (or with `opts["json"]` the whole analysis) to `out`;
    raises CommandFailed with the reason the file cannot be analysed."""
    path = Path(opts["path"])
    if not path.is_file():
        raise CommandFailed(f"{path}: no such file")
    try:
        kind = opts.get("kind") or detect_kind(path.name, read_head(path))
        if kind in REJECTED_KINDS:
            raise CommandFailed(REJECTED_KINDS[kind])
        started = time.perf_counter()
        analysis = analyze_path(
            path,
            kind,
            rank=opts.get("rank"),
            filename=path.name,
            max_decompressed_bytes=max_decompressed_bytes,
            time_zone=opts.get("timezone"),
        )
    except ArtifactError as exc:
        raise CommandFailed(f"{path.name}: {exc}") from None
    elapsed = time.perf_counter() - started
    if opts.get("json"):
        out.write(json.dumps({"kind": kind, **analysis}, indent=2, default=str) + "\n")
        return
    out.write(f"{path.name}: {kind}, analysed in {elapsed:.2f} s\n")
    for rank in analysis.get("ranks") or []:
        tb, ib = rank.get("temporal_breakdown") or {}, rank.get("idle_breakdown") or {}
        out.write(
            f"  rank {rank.get('rank')}: idle {tb.get('idle_pct')} %, compute {tb.get('compute_pct')} %, "
            f"non-compute {tb.get('non_compute_pct')} %; idle = host wait {ib.get('host_wait_pct')} %, "
            f"kernel wait {ib.get('kernel_wait_pct')} %, other {ib.get('other_pct')} %\n"
        )
    if not analysis.get("ranks"):
        out.write("  keys: " + ", ".join(sorted(analysis)) + "\n")


def _env_module() -> ModuleType:
    """efficiency/env.py alone: importing it as `efficiency.env` runs efficiency/__init__.py, which creates
    the Celery app (0.2 CPU-s, more than the rest of the start-up)."""
    path = Path(__file__).resolve().parents[2] / "efficiency" / "env.py"
    spec = importlib.util.spec_from_file_location("_efficiency_env_for_cli", path)
    if spec is None or spec.loader is None:  # pragma: no cover - the file ships with this one
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def max_decompressed_bytes_from_env() -> int:
    """ARTIFACT_MAX_DECOMPRESSED_BYTES as the settings read it (the same helper, default and bound)."""
    limit: int = _env_module().env_int(
        "ARTIFACT_MAX_DECOMPRESSED_BYTES", DEFAULT_MAX_DECOMPRESSED_BYTES, min_value=1024
    )
    return limit


def wants_django(argv: list[str]) -> bool:
    """Whether these arguments (after `analyze_artifact`) use one of Django's common options, which only
    the Django command understands."""
    return any(arg == opt or arg.startswith(opt + "=") for arg in argv for opt in DJANGO_OPTIONS)


def main(argv: list[str], prog: str = "manage.py analyze_artifact") -> int:
    """The command line without Django; returns the exit status (1 with `CommandError: reason` on
    stderr, as Django prints a refused command)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Analyse a profiling artifact (Kineto, nsys SQLite, nsys stats, ncu, py-spy, "
        "nvidia-smi, dstat).",
    )
    add_arguments(parser)
    opts = vars(parser.parse_args(argv))
    try:
        limit = max_decompressed_bytes_from_env()
    except ValueError as exc:  # env.EnvError: a malformed variable, named in the message
        print(f"ImproperlyConfigured: {exc}", file=sys.stderr)
        return 1
    try:
        run(opts, sys.stdout, max_decompressed_bytes=limit)
    except CommandFailed as exc:
        print(f"CommandError: {exc}", file=sys.stderr)
        return 1
    sys.stdout.flush()
    return 0
