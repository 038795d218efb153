"""Budgets and the last line of defence around every parser entry point.

`guarded(what)` wraps a parser's public function so that, whatever the upload holds:

* only `ArtifactError` escapes: any other exception (a parser bug met by a hostile file) becomes
  `ParserBug`, an `ArtifactError` whose message names the failure, so the upload fails with a reason;
* a wall-clock budget and a memory budget, both proportional to the input's size, bound the parse.
  Parsers call `checkpoint()` in their loops (cheap: a counter, the clock and the process' RSS every
  few thousand calls); past either budget the parse stops with an `ArtifactError` naming the budget;
* a dict result is made storable (`safe_json.make_storable`: NaN/Inf and integers past ±2^53 become
  None, NUL characters and lone surrogates are removed, strings are capped), with a warning saying how
  many values were unknown.

Guards nest: an inner guarded call runs inside the outer one's budget. Pure Python, no Django.
Budgets are cooperative (no signals), so they also hold in threads and in Celery's prefork children,
where the task's own soft time limit stays the outer bound.

The memory budget is also enforced by the kernel while the parse runs: a soft RLIMIT_AS of the process'
address space at the start plus the budget, restored when the parse ends. One C-level allocation past it
(a decoder building a huge object, numpy) then fails with MemoryError, which becomes the budget's
`ArtifactError`, instead of growing until the OOM killer takes the whole worker; the cooperative RSS check
cannot interrupt such a call. The limit applies to the whole process, so it is set only when the parse
runs in the process' only thread (the Celery prefork child, `manage.py analyze_artifact`); with other
threads running it would fail their allocations too, and the cooperative check alone applies.
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import threading
import time
import traceback
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from jobs.profiling.errors import ArtifactError, ParserBug
from jobs.profiling.safe_json import make_storable

#: Wall-clock budget: a base plus seconds per MiB of (decompressed) input. The slowest parser, Kineto with
#: its full analysis, runs at ~25 MiB/s on one core, so 2 s/MiB leaves a wide margin for a slow worker;
#: the Celery task's soft time limit (ARTIFACT_PARSE_BUDGET_S) stays the outer bound.
BASE_SECONDS = 30.0
SECONDS_PER_MIB = 2.0
#: Memory budget: growth of the process' resident memory over its size when the parse started, at most
#: a base plus this many times the (decompressed) input. Measured peaks are below 4x (README).
BASE_MEMORY_BYTES = 256 * 1024**2
MEMORY_PER_INPUT_BYTE = 6.0
_CHECK_EVERY = 4096

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

P = ParamSpec("P")
R = TypeVar("R")


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _address_space_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[0]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class _AddressSpaceLimit:
    """A soft RLIMIT_AS of (address space now + budget) for the duration of one parse."""

    def __init__(self) -> None:
        self.base: int | None = None
        self.previous: tuple[int, int] | None = None

    def start(self, budget_bytes: int) -> None:
        if threading.active_count() != 1:
            return
        base = _address_space_bytes()
        if base is None:
            return
        try:
            self.previous = resource.getrlimit(resource.RLIMIT_AS)
        except (OSError, ValueError):
            return
        self.base = base
        self.resize(budget_bytes)

    def resize(self, budget_bytes: int) -> None:
        if self.base is None or self.previous is None:
            return
        soft, hard = self.previous
        limit = self.base + budget_bytes
        if soft != resource.RLIM_INFINITY:
            limit = min(limit, soft)  # never loosen a limit someone else set
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))

    def stop(self) -> None:
        if self.previous is not None:
            with contextlib.suppress(OSError, ValueError):
                resource.setrlimit(resource.RLIMIT_AS, self.previous)
        self.base = self.previous = None


@dataclass
class Budget:
    """The limits of one parse; `input_bytes` may grow once a compressed input is decompressed."""

    what: str
    input_bytes: int
    started: float
    rss_at_start: int | None
    seconds: float = 0.0
    memory_bytes: int = 0
    calls: int = 0
    address_space: _AddressSpaceLimit | None = None

    def __post_init__(self) -> None:
        self.resize(self.input_bytes)

    def resize(self, input_bytes: int) -> None:
        self.input_bytes = max(self.input_bytes, input_bytes)
        mib = self.input_bytes / 1024**2
        self.seconds = BASE_SECONDS + SECONDS_PER_MIB * mib
        self.memory_bytes = BASE_MEMORY_BYTES + int(MEMORY_PER_INPUT_BYTE * self.input_bytes)
        if self.address_space is not None:
            self.address_space.resize(self.memory_bytes)

    def memory_message(self) -> str:
        """Why a parse that exceeded its memory budget was stopped."""
        return (
            f"Parsing the {self.what} needed more than its memory budget of "
            f"{self.memory_bytes / 1024**2:.0f} MiB ({BASE_MEMORY_BYTES / 1024**2:.0f} MiB + "
            f"{MEMORY_PER_INPUT_BYTE:g}x its {self.input_bytes / 1024**2:.1f} MiB) and was stopped."
        )

    def check(self) -> None:
        elapsed = time.monotonic() - self.started
        if elapsed > self.seconds:
            raise ArtifactError(
                f"Parsing the {self.what} took longer than its budget of {self.seconds:.0f} s "
                f"({BASE_SECONDS:.0f} s + {SECONDS_PER_MIB:g} s per MiB of its "
                f"{self.input_bytes / 1024**2:.1f} MiB) and was stopped."
            )
        rss = _rss_bytes()
        if rss is not None and self.rss_at_start is not None and rss - self.rss_at_start > self.memory_bytes:
            raise ArtifactError(self.memory_message())


_current: ContextVar[Budget | None] = ContextVar("parser_budget", default=None)


def checkpoint() -> None:
    """Call often from parser loops: every few thousand calls, checks the running parse's budgets."""
    budget = _current.get()
    if budget is None:
        return
    budget.calls += 1
    if budget.calls % _CHECK_EVERY == 0:
        budget.check()


def check_now() -> None:
    """Check the running parse's budgets at once (before and after a big step)."""
    budget = _current.get()
    if budget is not None:
        budget.check()


def grow_input(nbytes: int) -> None:
    """Tell the running parse its input is `nbytes` (e.g. after decompression): the budgets scale."""
    budget = _current.get()
    if budget is not None:
        budget.resize(nbytes)


def input_size(source: Any) -> int:
    """Bytes of a parser's input: a path's size, the length of bytes or text, a parsed Trace's input."""
    if isinstance(source, bytes | bytearray | memoryview):
        return len(source)
    if isinstance(source, str) and (len(source) > 4096 or "\n" in source):
        return len(source)
    if isinstance(source, str | Path):
        try:
            return Path(source).stat().st_size
        except (OSError, ValueError):
            return len(source) if isinstance(source, str) else 0
    known = getattr(source, "input_bytes", None)
    if isinstance(known, int) and known > 0:
        return known
    nbytes = getattr(source, "nbytes", None)  # a parsed Trace: the size of its columns
    if callable(nbytes):
        try:
            return int(nbytes())
        except Exception:
            return 0
    return 0


def _where(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).name != "guard.py"]
    ours = [f for f in frames if "jobs/profiling" in f.filename.replace("\\", "/")] or frames
    if not ours:
        return "?"
    last = ours[-1]
    return f"{Path(last.filename).name}:{last.lineno}"


def _is_worker_stop(exc: BaseException) -> bool:
    # Celery's soft time limit (an Exception subclass) is the task's budget, not a parse failure: let the
    # task handle it. Matched by name so parsers need no Celery import.
    return type(exc).__name__ in ("SoftTimeLimitExceeded", "TimeLimitExceeded", "WorkerLostError")


def guarded(what: str, *, storable: bool = True) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator for a parser entry point whose first argument is its input (path, bytes or Trace)."""

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            outer = _current.get()
            if outer is not None:
                return func(*args, **kwargs)
            source = args[0] if args else next(iter(kwargs.values()), None)
            budget = Budget(what, input_size(source), time.monotonic(), _rss_bytes())
            limit = _AddressSpaceLimit()
            limit.start(budget.memory_bytes)
            budget.address_space = limit
            token = _current.set(budget)
            try:
                result = func(*args, **kwargs)
                budget.check()
            except ArtifactError:
                raise
            except RecursionError as exc:
                raise ArtifactError(f"The {what} is nested too deeply to read.") from exc
            except MemoryError:
                # Past the address-space limit (or the machine's memory). Lift the limit before building
                # the message, and chain nothing: the traceback's frames hold what the parse allocated,
                # which must be freed now, not when the caller is done with the error.
                limit.stop()
                raise ArtifactError(budget.memory_message()) from None
            except Exception as exc:
                if _is_worker_stop(exc):
                    raise
                raise ParserBug(
                    f"The {what} could not be parsed: the parser failed with {type(exc).__name__} "
                    f"at {_where(exc)} ({str(exc)[:200]}). The file is kept; this is a bug in efficiency."
                ) from exc
            finally:
                limit.stop()
                _current.reset(token)
            if storable and isinstance(result, dict):
                cleaned, changed = make_storable(result)
                if changed:
                    note = (
                        f"{changed} value(s) in the {what} were not finite numbers, out of range or held "
                        "characters that cannot be stored; they are shown as unknown or cleaned."
                    )
                    if isinstance(cleaned.get("warnings"), list):
                        cleaned["warnings"].append(note)
                    else:
                        cleaned.setdefault("storage_notes", []).append(note)
                return cleaned
            return result

        return wrapper

    return decorate
