"""The lenient decoder behind every stored-analysis schema (jobs.profiling.schema), and `Num`.

A missing key or a value of the wrong type reads as the field's default, a list entry of the wrong
shape is dropped, unknown keys are ignored, a non-finite number reads as None: decoding never raises on
stored data (analyses stored by older parser versions or partial parses lack keys or carry other types).

Pure: no Django.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from functools import cache
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import inspect as mi

S = TypeVar("S", bound=msgspec.Struct)

#: A finite float. The bounds make msgspec refuse NaN and ±inf (a comparison with NaN is false), so the
#: strict fast path of `lenient` falls back to the field-by-field walk, which reads them as None.
Num = Annotated[float, msgspec.Meta(ge=-sys.float_info.max, le=sys.float_info.max)]


class _Unfit(Exception):
    """A stored value does not fit the declared type (internal: the field then takes its default)."""


@cache
def _info(cls: type[msgspec.Struct]) -> mi.StructType:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType), cls
    return info


def _fit(value: Any, t: mi.Type) -> Any:
    """`value` as type `t`, or _Unfit. Lists and dicts keep the entries that fit."""
    if isinstance(t, mi.AnyType):
        return value
    if isinstance(t, mi.NoneType):
        if value is None:
            return None
        raise _Unfit
    if isinstance(t, mi.UnionType):
        for member in t.types:
            try:
                return _fit(value, member)
            except _Unfit:
                continue
        raise _Unfit
    if isinstance(t, mi.BoolType):
        if isinstance(value, bool):
            return value
        raise _Unfit
    if isinstance(t, mi.IntType):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Unfit
    if isinstance(t, mi.FloatType):
        # bool is an int in Python but never a measurement; NaN/inf are "unknown" (make_storable writes None).
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        raise _Unfit
    if isinstance(t, mi.StrType):
        if isinstance(value, str):
            return value
        raise _Unfit
    if isinstance(t, mi.ListType):
        if not isinstance(value, list):
            raise _Unfit
        out = []
        for item in value:
            try:
                out.append(_fit(item, t.item_type))
            except _Unfit:
                continue
        return out
    if isinstance(t, mi.DictType):
        if not isinstance(value, Mapping):
            raise _Unfit
        kept = {}
        for k, v in value.items():
            if not isinstance(k, str):
                continue
            try:
                kept[k] = _fit(v, t.value_type)
            except _Unfit:
                continue
        return kept
    if isinstance(t, mi.StructType):
        return _struct(value, t)
    raise TypeError(f"schema cannot decode {t!r}")  # a declaration error, not bad data


def _struct(value: Any, t: mi.StructType) -> Any:
    if not isinstance(value, Mapping):
        raise _Unfit
    kwargs: dict[str, Any] = {}
    for field in t.fields:
        if field.encode_name in value:
            try:
                kwargs[field.name] = _fit(value[field.encode_name], field.type)
            except _Unfit:
                continue  # the field's default: a wrong type reads as absent
    return t.cls(**kwargs)


def lenient(payload: Any, cls: type[S]) -> S:
    """`payload` decoded as `cls`, field by field: what is missing or does not fit takes the default.

    A payload that is not a mapping at all gives `cls()` (every field at its default). A payload that
    fits as a whole is converted by msgspec in one call (about 0.01 ms for a trace analysis where the
    walk takes about 1 ms); one that does not is walked field by field.
    """
    if isinstance(payload, dict):
        try:
            return msgspec.convert(payload, cls)
        except msgspec.ValidationError:
            pass
    try:
        out = _struct(payload, _info(cls))
    except _Unfit:
        return cls()
    assert isinstance(out, cls)
    return out


def declared_paths(cls: type[msgspec.Struct]) -> list[str]:
    """Every leaf a Struct declares, as stored-key paths ("a.b", "a.c[].d"): what its readers can read.

    The parsers' authors check a rename against this (tests/unit/test_real_samples_diagnosis).
    """
    out: list[str] = []

    def walk(t: mi.Type, prefix: str) -> None:
        if isinstance(t, mi.UnionType):
            structs = [m for m in t.types if isinstance(m, mi.StructType)]
            if structs:
                walk(structs[0], prefix)
                return
        if isinstance(t, mi.StructType):
            for field in t.fields:
                walk(field.type, f"{prefix}.{field.encode_name}" if prefix else field.encode_name)
            return
        if isinstance(t, mi.ListType) and isinstance(t.item_type, mi.StructType):
            walk(t.item_type, prefix + "[]")
            return
        out.append(prefix)

    walk(_info(cls), "")
    return out
