"""What an analysis must be to be stored and served: finite JSON that Postgres' jsonb and orjson accept.

Pure Python, no Django: the parsers' guard (`jobs.profiling.guard`) cleans every analysis with
`make_storable`, the fuzz tests assert `storable_problems(...) == []`, and the artifact pipeline can call
`check_storable` before saving.

Storable means: only dicts with string keys, lists (tuples allowed), strings, bools, None, finite floats
and integers within ±2^53 (the range every JSON reader keeps exactly, orjson's and JavaScript's
included); no NUL character and no lone UTF-16 surrogate in any string or key (Postgres' text and jsonb
refuse both); at most `MAX_DEPTH` levels of nesting.
"""

from __future__ import annotations

import math
import re
from typing import Any

from jobs.profiling.errors import ArtifactError

#: Integers beyond this magnitude lose precision in float64 JSON readers; they are "unknown" (None).
MAX_SAFE_INT = 2**53
MAX_DEPTH = 64
#: The longest string kept in an analysis; longer ones are cut with "…".
MAX_STRING_CHARS = 4096

_BAD_CHARS = re.compile(r"[\x00\ud800-\udfff]")


def _text_problem(text: str) -> str | None:
    found = _BAD_CHARS.search(text)
    if found is None:
        return None
    return "a NUL character" if found.group() == "\x00" else "a lone surrogate"


def storable_problems(obj: Any, *, limit: int = 20) -> list[str]:
    """Why `obj` cannot be stored as is: up to `limit` messages with the path of each offending value.

    An empty list means Postgres jsonb and orjson both accept it and every value reads back unchanged.
    """
    problems: list[str] = []

    def visit(value: Any, path: str, depth: int) -> None:
        if len(problems) >= limit:
            return
        if depth > MAX_DEPTH:
            problems.append(f"{path}: nested deeper than {MAX_DEPTH} levels")
            return
        if value is None or isinstance(value, bool):
            return
        if isinstance(value, int):
            if not -MAX_SAFE_INT <= value <= MAX_SAFE_INT:
                problems.append(f"{path}: integer {value} is beyond ±2^53")
            return
        if isinstance(value, float):
            if not math.isfinite(value):
                problems.append(f"{path}: {value} is not a finite number")
            return
        if isinstance(value, str):
            why = _text_problem(value)
            if why:
                problems.append(f"{path}: string holds {why}")
            return
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    problems.append(f"{path}: key {key!r} is a {type(key).__name__}, not a string")
                    continue
                why = _text_problem(key)
                if why:
                    problems.append(f"{path}: key holds {why}")
                visit(item, f"{path}.{key[:40]}", depth + 1)
            return
        if isinstance(value, list | tuple):
            for i, item in enumerate(value):
                visit(item, f"{path}[{i}]", depth + 1)
            return
        problems.append(f"{path}: a {type(value).__name__} is not JSON data")

    visit(obj, "$", 0)
    if not problems:
        # Imported here: every parser imports this module (through the guard), and orjson with its
        # datetime/uuid imports cost the command line ~5 ms of start-up for a check it never runs.
        import orjson

        try:
            orjson.dumps(obj)
        except (TypeError, orjson.JSONEncodeError) as exc:  # pragma: no cover - the walk above covers it
            problems.append(f"$: orjson refuses it: {exc}")
    return problems


def check_storable(obj: Any) -> None:
    """Raise `ArtifactError` naming the first offending values when `obj` is not storable."""
    problems = storable_problems(obj, limit=5)
    if problems:
        raise ArtifactError("The analysis cannot be stored: " + "; ".join(problems) + ".")


def clean_text(text: str, max_chars: int = MAX_STRING_CHARS) -> str:
    """`text` without NUL characters, lone surrogates replaced by U+FFFD, cut to `max_chars`."""
    if _BAD_CHARS.search(text) is not None:
        text = _BAD_CHARS.sub(lambda m: "" if m.group() == "\x00" else "\ufffd", text)
    if len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    return text


def finite_or_none(value: Any) -> float | None:
    """A finite float, or None for anything else (NaN, ±Inf, non-numbers, numbers past float range)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        out = float(value)
    except OverflowError:
        return None
    return out if math.isfinite(out) else None


def make_storable(obj: Any, *, max_string_chars: int = MAX_STRING_CHARS) -> tuple[Any, int]:
    """A storable copy of `obj` and how many values had to change.

    NaN, ±Inf and integers beyond ±2^53 become None (unknown); NUL characters are dropped and lone
    surrogates become U+FFFD; strings are cut to `max_string_chars`; numpy scalars and arrays become
    Python numbers and lists; tuples become lists; nesting deeper than `MAX_DEPTH` is cut to None.
    Anything else that is not JSON data becomes its capped `str()`.
    """
    changed = 0

    def fix(value: Any, depth: int) -> Any:
        nonlocal changed
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            if -MAX_SAFE_INT <= value <= MAX_SAFE_INT:
                return value
            changed += 1
            return None
        if isinstance(value, float):
            if math.isfinite(value):
                return value
            changed += 1
            return None
        if isinstance(value, str):
            out = clean_text(value, max_string_chars)
            if out is not value and out != value:
                changed += 1
            return out
        if depth >= MAX_DEPTH:
            changed += 1
            return None
        if isinstance(value, dict):
            result: dict[str, Any] = {}
            for key, item in value.items():
                skey = clean_text(key if isinstance(key, str) else str(key), max_string_chars)
                if skey != key:
                    changed += 1
                result[skey] = fix(item, depth + 1)
            return result
        if isinstance(value, list | tuple):
            return [fix(item, depth + 1) for item in value]
        tolist = getattr(value, "tolist", None)  # numpy scalars and arrays
        if callable(tolist):
            return fix(tolist(), depth)
        changed += 1
        return clean_text(str(value), max_string_chars)

    return fix(obj, 0), changed
