"""PromQL query builder: escaped label matchers, validated label names, and job selectors.

Every label value that reaches PromQL goes through `promql_string` (escapes backslash, double quote and
control characters); label names are validated against `[a-zA-Z_][a-zA-Z0-9_]*`. A job id such as
`"} or vector(1) #` therefore stays inside a string literal and cannot change the query.

Label-name spellings (`Hostname` in released dcgm-exporters, `hostname` in 2026 main, `exported_*` when
Prometheus renamed a scraped label that clashed with a target label) are handled by `Selector`. A PromQL
selector cannot say "label A or label B equals x", so a Selector holds several *alternatives* (one matcher
list per spelling) and expressions join them with `or`. `or` keeps every series of its left side plus
the right-side series whose label set (ignoring the metric name) is new: a series matched by two
alternatives is counted once, and `old_name or new_name` keeps one metric name per GPU. We chose this
over `label_replace` into a common label because that cannot filter afterwards without a join and would
first select every series of the metric in the cluster.

Pure Python, no Django, no I/O; `jobs.metrics.prometheus` re-exports these names.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

HOST_LABELS: tuple[str, ...] = ("Hostname", "hostname")
UUID_LABELS: tuple[str, ...] = ("UUID", "uuid")
# Every spelling of the host label a stored series may carry, in order of preference for GPU keys.
HOST_LABEL_SPELLINGS: tuple[str, ...] = (*HOST_LABELS, *(f"exported_{n}" for n in HOST_LABELS))
_FAMILIES: dict[str, tuple[str, ...]] = {n: HOST_LABELS for n in HOST_LABELS} | {
    n: UUID_LABELS for n in UUID_LABELS
}
MAX_ALTERNATIVES = 64
_MAX_ALTERNATIVES = MAX_ALTERNATIVES

_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_METRIC_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# Go's regexp.QuoteMeta set: Prometheus matchers are Go RE2 regexes, fully anchored.
_REGEX_META = frozenset(r"\.+*?()|[]{}^$")


def validate_label_name(name: str) -> str:
    """Return `name` if it is a valid Prometheus label name, else raise ValueError."""
    if not isinstance(name, str) or not _LABEL_NAME_RE.fullmatch(name):
        raise ValueError(f"invalid label name {name!r}: must match [a-zA-Z_][a-zA-Z0-9_]*")
    return name


def validate_metric_name(name: str) -> str:
    """Return `name` if it is a valid Prometheus metric name, else raise ValueError."""
    if not isinstance(name, str) or not _METRIC_NAME_RE.fullmatch(name):
        raise ValueError(f"invalid metric name {name!r}")
    return name


def escape_label_value(value: str) -> str:
    """Escape a value for a double-quoted PromQL string (without the quotes).

    Backslash, double quote and newline must be escaped (a raw newline ends the literal with an error);
    other control characters are written as \\xHH so the query stays one readable line.
    """
    if not isinstance(value, str):
        raise TypeError(f"label value must be str, not {type(value).__name__}")
    if value.isprintable() and "\\" not in value and '"' not in value:
        # Nothing to escape (control characters and lone surrogates are not printable): the common case,
        # in C. The poll cycle renders selectors of hundreds of job ids per query (#26 item 2).
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates: Prometheus would reject invalid UTF-8
        raise ValueError(f"label value is not valid UTF-8: {value!r}") from exc
    out: list[str] = []
    for ch in value:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def promql_string(value: str) -> str:
    """A double-quoted PromQL string literal holding exactly `value`."""
    return f'"{escape_label_value(value)}"'


def label_matcher(name: str, value: str, *, negate: bool = False) -> str:
    """`name="value"` (or `!=`), with the name validated and the value escaped."""
    return f"{validate_label_name(name)}{'!=' if negate else '='}{promql_string(value)}"


def regex_matcher(name: str, pattern: str, *, negate: bool = False) -> str:
    """`name=~"pattern"` (or `!~`). The pattern is a Go RE2 regex, anchored by Prometheus; it is escaped
    as a string literal, so it cannot break out of the matcher (its regex meaning is the caller's)."""
    return f"{validate_label_name(name)}{'!~' if negate else '=~'}{promql_string(pattern)}"


def regex_escape(literal: str) -> str:
    """Quote RE2 metacharacters so `literal` matches only itself (Go's regexp.QuoteMeta)."""
    return "".join(f"\\{ch}" if ch in _REGEX_META else ch for ch in literal)


T = TypeVar("T")


def regex_batches(
    items: Iterable[T], literals: Callable[[T], Iterable[str]], max_chars: int
) -> list[list[T]]:
    """`items` in order, cut into batches whose escaped regex alternatives (`literals` of each item, one
    `|` each) stay within `max_chars`, so one query's matcher stays bounded; an item longer than that is a
    batch of its own."""
    batches: list[list[T]] = []
    size = 0
    for item in items:
        cost = sum(len(regex_escape(v)) + 1 for v in literals(item))
        if batches and size + cost <= max_chars:
            batches[-1].append(item)
            size += cost
        else:
            batches.append([item])
            size = cost
    return batches


def regex_any(literals: Iterable[str]) -> str:
    """A regex matching exactly one of `literals` (sorted, deduplicated, each escaped)."""
    values = sorted(set(literals))
    if not values:
        raise ValueError("regex_any needs at least one value")
    return "|".join(regex_escape(v) for v in values)


def duration(seconds: float) -> str:
    """A PromQL duration literal for a positive number of seconds (`300s`, `1500ms`)."""
    if not seconds > 0 or not math.isfinite(seconds):
        raise ValueError(f"duration must be positive, got {seconds}")
    if float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{max(1, round(seconds * 1000))}ms"


@dataclass(frozen=True, slots=True)
class Matcher:
    """One label matcher; `render()` escapes the value and validates the name."""

    name: str
    op: Literal["=", "!=", "=~", "!~"]
    value: str

    def __post_init__(self) -> None:
        validate_label_name(self.name)
        if self.op not in ("=", "!=", "=~", "!~"):
            raise ValueError(f"invalid matcher operator {self.op!r}")

    def render(self) -> str:
        """PromQL text of this matcher."""
        return f"{self.name}{self.op}{promql_string(self.value)}"

    def matches_empty(self) -> bool:
        """Whether the matcher also selects series that lack the label (Python re approximates RE2)."""
        if self.op == "=":
            return self.value == ""
        if self.op == "!=":
            return self.value != ""
        try:
            hit = re.fullmatch(self.value, "") is not None
        except re.error:
            return False  # syntax Python lacks: let Prometheus judge it
        return hit if self.op == "=~" else not hit


@dataclass(frozen=True, slots=True)
class GpuRef:
    """One GPU as the scheduler names it: host name and GPU index on that host."""

    hostname: str
    gpu: int

    @classmethod
    def coerce(cls, value: GpuRef | Mapping[str, Any]) -> GpuRef:
        """Accept a GpuRef or a mapping with `hostname` (or `Hostname`) and `gpu`."""
        if isinstance(value, GpuRef):
            return value
        host = value.get("hostname", value.get("Hostname"))
        gpu = value.get("gpu")
        if not isinstance(host, str) or not host:
            raise ValueError(f"GPU reference needs a non-empty hostname: {value!r}")
        if isinstance(gpu, bool) or not isinstance(gpu, int | str) or not str(gpu).isdigit():
            raise ValueError(f"GPU reference needs a non-negative integer gpu index: {value!r}")
        return cls(host, int(gpu))


def label_spellings(name: str) -> tuple[str, ...]:
    """Every label name under which dcgm-exporter's `name` may be stored: host and UUID families
    (`Hostname`/`hostname`, `UUID`/`uuid`) and their `exported_` renames. Explicit `exported_*` and
    other names get only themselves plus their `exported_` rename."""
    validate_label_name(name)
    if name.startswith("exported_"):
        return (name,)
    family = _FAMILIES.get(name, (name,))
    return (*family, *(f"exported_{n}" for n in family))


def count_label_alternatives(labels: Mapping[str, Any]) -> int:
    """How many alternatives `Selector.from_labels(labels)` would build (the product of each label's
    spellings), computed without building them: 30 labels would be 2^30 matcher lists."""
    return math.prod(len(label_spellings(name)) for name in labels)


class Selector:
    """Which series belong to a job: a list of alternative matcher lists, joined with `or` in queries.

    Build one with `from_gpus`, `from_uuids` or `from_labels`; never from raw PromQL text.
    """

    __slots__ = ("_alternatives",)

    def __init__(self, alternatives: Sequence[Sequence[Matcher]]) -> None:
        alts = tuple(tuple(a) for a in alternatives)
        if not alts or any(not a for a in alts):
            raise ValueError("a selector needs at least one non-empty alternative")
        for alt in alts:
            if all(m.matches_empty() for m in alt):
                # Such an alternative would select every GPU of the cluster, not the job's.
                raise ValueError(f"selector alternative matches series without any of its labels: {alt}")
        if len(alts) > _MAX_ALTERNATIVES:
            raise ValueError(f"selector expands to {len(alts)} alternatives (max {_MAX_ALTERNATIVES})")
        self._alternatives = alts

    @classmethod
    def from_gpus(cls, gpus: Iterable[GpuRef | Mapping[str, Any]]) -> Selector:
        """Explicit GPUs. Hosts with the same set of GPU indexes share one matcher pair
        (`Hostname=~"a|b", gpu=~"0|1"`), so the query grows with distinct GPU sets, not with hosts."""
        by_host: dict[str, set[int]] = {}
        for ref in map(GpuRef.coerce, gpus):
            by_host.setdefault(ref.hostname, set()).add(ref.gpu)
        if not by_host:
            raise ValueError("from_gpus needs at least one GPU")
        groups: dict[tuple[int, ...], list[str]] = {}
        for host, idx in by_host.items():
            groups.setdefault(tuple(sorted(idx)), []).append(host)
        alts: list[list[Matcher]] = []
        for gpu_set, hosts in sorted(groups.items()):
            gpu_m = _eq_or_any("gpu", [str(i) for i in gpu_set])
            for spelling in label_spellings("Hostname"):
                alts.append([_eq_or_any(spelling, hosts), gpu_m])
        return cls(alts)

    @classmethod
    def from_uuids(cls, uuids: Iterable[str]) -> Selector:
        """GPUs by UUID (unique across hosts, so no host matcher)."""
        values = [u for u in uuids if u]
        if not values:
            raise ValueError("from_uuids needs at least one UUID")
        return cls([[_eq_or_any(s, values)] for s in label_spellings("UUID")])

    @classmethod
    def from_labels(cls, labels: Mapping[str, Any]) -> Selector:
        """A label selector such as {"hpc_job": "48213"} or {"namespace": "llm", "pod": Regex("a-.*")}.

        Values: str = exact match; `Regex`, a compiled `re.Pattern` or {"regex": "..."} = regex match.
        Each label expands to its spellings (`label_spellings`), alternatives are their product.
        """
        if not labels:
            raise ValueError("from_labels needs at least one label")
        if (count := count_label_alternatives(labels)) > _MAX_ALTERNATIVES:
            raise ValueError(f"selector expands to {count} alternatives (max {_MAX_ALTERNATIVES})")
        per_label: list[list[Matcher]] = []
        for name, raw in labels.items():
            op, value = _matcher_spec(name, raw)
            per_label.append([Matcher(s, op, value) for s in label_spellings(name)])
        return cls([list(combo) for combo in itertools.product(*per_label)])

    @property
    def matchers(self) -> tuple[tuple[Matcher, ...], ...]:
        """The alternatives as matcher tuples (the poll cycle groups jobs by their label names)."""
        return self._alternatives

    def restricted(self, labels: Iterable[str]) -> Selector | None:
        """Only the alternatives whose label names all exist in `labels` (the cycle's discovery of which
        spellings Prometheus holds); None when none is left: the selector cannot match any series."""
        present = set(labels)
        kept = [alt for alt in self._alternatives if all(m.name in present for m in alt)]
        return Selector(kept) if kept else None

    @property
    def alternatives(self) -> tuple[str, ...]:
        """Rendered matcher lists, e.g. ('Hostname="a",gpu="0"', 'hostname="a",gpu="0"', ...)."""
        return tuple(",".join(m.render() for m in alt) for alt in self._alternatives)

    def select(self, metrics: str | Sequence[str]) -> str:
        """Instant-vector expression of `metrics` (preferred name first) restricted to this selector."""
        names = _metric_names(metrics)
        return " or ".join(f"{n}{{{alt}}}" for n in names for alt in self.alternatives)

    def select_range(self, metrics: str | Sequence[str], func: str, window_s: float) -> str:
        """`func(metric{alt}[window])` for every name and alternative, joined with `or` (for rate etc.)."""
        if not _LABEL_NAME_RE.fullmatch(func):
            raise ValueError(f"invalid function name {func!r}")
        names = _metric_names(metrics)
        win = duration(window_s)
        return " or ".join(f"{func}({n}{{{alt}}}[{win}])" for n in names for alt in self.alternatives)

    def series_selectors(self, name_regex: str | None = None) -> list[str]:
        """One series selector per alternative, for `match[]` parameters (/api/v1/series, label values)."""
        head = f"__name__=~{promql_string(name_regex)}," if name_regex else ""
        return [f"{{{head}{alt}}}" for alt in self.alternatives]

    def __repr__(self) -> str:
        return f"Selector({' | '.join(self.alternatives)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Selector) and other._alternatives == self._alternatives

    def __hash__(self) -> int:
        return hash(self._alternatives)


@dataclass(frozen=True, slots=True)
class Regex:
    """Marks a selector value as an RE2 regex rather than an exact value."""

    pattern: str


def _matcher_spec(name: str, raw: Any) -> tuple[Literal["=", "=~"], str]:
    validate_label_name(name)
    if isinstance(raw, str):
        if raw == "":
            raise ValueError(f"empty value for label {name!r} would match series without it")
        return "=", raw
    if isinstance(raw, Regex):
        return "=~", raw.pattern
    if isinstance(raw, re.Pattern):
        return "=~", str(raw.pattern)
    if isinstance(raw, Mapping) and set(raw) == {"regex"} and isinstance(raw["regex"], str):
        return "=~", raw["regex"]
    raise ValueError(f"label {name!r}: value must be str, Regex, re.Pattern or {{'regex': str}}, got {raw!r}")


def _eq_or_any(name: str, values: Sequence[str]) -> Matcher:
    uniq = sorted(set(values))
    if len(uniq) == 1:
        return Matcher(name, "=", uniq[0])
    return Matcher(name, "=~", regex_any(uniq))


def _metric_names(metrics: str | Sequence[str]) -> list[str]:
    names = [metrics] if isinstance(metrics, str) else list(dict.fromkeys(metrics))
    if not names:
        raise ValueError("at least one metric name is required")
    return [validate_metric_name(n) for n in names]


def gpu_key(labels: Mapping[str, str]) -> tuple[str, str]:
    """(host, gpu index) of a series, whichever host-label spelling it carries ('' when absent)."""
    host = next((labels[n] for n in HOST_LABEL_SPELLINGS if labels.get(n)), "")
    return host, labels.get("gpu", "")
