"""Request bodies and text checked at the edge: JSON with a depth and size limit and no NUL, control
characters or lone surrogates in any string, so nothing malformed reaches the ORM or PromQL (issue #13)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_JSON_DEPTH = 32
# C0 controls (tab, newline and carriage return allowed in free text), DEL, and UTF-16 surrogates: a lone
# surrogate cannot be encoded as UTF-8 (Postgres refuses it) and a NUL cannot be stored in a text column.
_FREE_TEXT_BAD = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")
_STRICT_BAD = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


def text_problem(value: str, *, strict: bool = True) -> str | None:
    """Why `value` cannot be accepted (NUL, control character, lone surrogate), or None when it can.

    `strict` refuses every control character (names, labels, paths, query parameters); otherwise tab,
    newline and carriage return are allowed (free text such as a PromQL query)."""
    found = (_STRICT_BAD if strict else _FREE_TEXT_BAD).search(value)
    if found is None:
        return None
    code = ord(found.group())
    if code == 0:
        return "contains a NUL character (control characters are not allowed)"
    if 0xD800 <= code <= 0xDFFF:
        return f"contains a lone surrogate U+{code:04X} (not valid Unicode text)"
    return f"contains the control character U+{code:04X} (control characters are not allowed)"


def json_problem(value: Any, *, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """The first problem of a decoded JSON document: too deep, or a bad string (key or value)."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "$")]
    while stack:
        item, depth, where = stack.pop()
        if depth > max_depth:
            return f"{where}: nested deeper than {max_depth} levels"
        if isinstance(item, str):
            if problem := text_problem(item, strict=False):
                return f"{where}: {problem}"
        elif isinstance(item, Mapping):
            for key, child in item.items():
                if isinstance(key, str) and (problem := text_problem(key)):
                    return f"{where}: key {key!r} {problem}"
                stack.append((child, depth + 1, f"{where}.{key}"))
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1, f"{where}[{i}]") for i, child in enumerate(item))
    return None


class SafeJSONParser(JSONParser):
    """DRF's strict JSON parser (no NaN/Infinity literals) plus a size, depth and string check."""

    def parse(self, stream: IO[Any], media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read(limit + 1) if stream is not None else b""
        if limit is not None and len(raw) > limit:
            raise ParseError(f"JSON body larger than {limit} bytes")
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = raw.decode(encoding)
            data = json.loads(text, parse_constant=_refuse_constant)
        except RecursionError:
            raise ParseError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ParseError(f"JSON parse error - {str(exc)[:200]}") from None
        if problem := json_problem(data):
            raise ParseError(f"JSON body refused: {problem[:300]}")
        if _has_non_finite(data):
            raise ParseError("JSON body refused: numbers must be finite (1e309 overflows to infinity)")
        return data


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def _has_non_finite(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and (item != item or item in (float("inf"), float("-inf"))):
            return True
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
