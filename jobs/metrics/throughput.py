"""A job's throughput PromQL as a safe template, and the rule that a job selects only its own GPUs.

Why: the server runs a job's `throughput_query` with its own Prometheus rights, so free text would read
any team's series, the cluster's power, or cost a poll a minute (issue #13.5). A team member therefore
writes a *template*: a small PromQL subset in which every vector selector is exactly `metric{$job}`, e.g.

    sum(rate(train_tokens_total{$job}[5m]))

`$job` expands to the job's own matcher (`expand`): `<THROUGHPUT_JOB_LABEL>="<external id>"`, by default
`job_id="48213"`, however the job's GPUs were selected. A trainer's own metrics (tokens, steps) are not
dcgm-exporter series and rarely carry the exporter's labels, so the job's GPU selector is not reused; the
job's external id is its identity (unique; one registered to another team cannot be taken). The value is
escaped with `jobs.metrics.promql.label_matcher`, so an id cannot leave its string literal.
`validate_template` parses the template and refuses, with the rule in the message:

- any label matcher other than `$job` (no `{job_id=~".+"}`, no `{__name__=~...}`), any string literal;
- a metric without `{$job}` (every vector selector reads only the job's series), or no selector at all;
- functions and aggregations outside `FUNCTIONS` / `AGGREGATIONS` (no `label_replace`, `absent`, ...),
  `offset`, `@`, vector-matching modifiers (`on`, `group_left`), comparisons and set operators;
- a range (`[5m]`) or subquery range longer than the maximum lookback; a subquery nested in another,
  without an explicit step, or of more than `MAX_SUBQUERY_POINTS` steps.

Staff may store free-form PromQL instead (`FREE_FORM_MARK` is prefixed, a PromQL comment, so the stored
text still runs as is); a free-form query without the mark (stored before templates existed, or by a
non-staff user) is not run: `runnable_query` says why, and the job's throughput is unknown with it.

Pure Python, no Django: settings (lookback, job label) are passed in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from jobs.metrics.promql import (
    label_matcher,
    regex_any,
    regex_batches,
    regex_matcher,
    validate_label_name,
)

JOB_PLACEHOLDER = "$job"
FREE_FORM_MARK = "# free-form PromQL set by staff\n"
MAX_SUBQUERY_POINTS = 1000
MAX_TEMPLATE_CHARS = 2000

Kind = Literal["scalar", "vector", "matrix"]

#: Range-vector functions (their one argument is a matrix), and the instant-vector ones with the types of
#: their arguments. Nothing that renames labels, reads metadata or builds series from nothing.
RANGE_FUNCTIONS = frozenset(
    {
        "rate", "irate", "increase", "delta", "idelta", "deriv", "avg_over_time", "sum_over_time",
        "min_over_time", "max_over_time", "count_over_time", "last_over_time",
    }
)  # fmt: skip
VECTOR_FUNCTIONS: dict[str, tuple[tuple[Kind, ...], ...]] = {
    "abs": (("vector",),),
    "ceil": (("vector",),),
    "floor": (("vector",),),
    "round": (("vector",), ("vector", "scalar")),
    "clamp": (("vector", "scalar", "scalar"),),
    "clamp_min": (("vector", "scalar"),),
    "clamp_max": (("vector", "scalar"),),
}
FUNCTIONS = RANGE_FUNCTIONS | frozenset(VECTOR_FUNCTIONS)
AGGREGATIONS = frozenset({"sum", "avg", "min", "max", "count"})
_ARITHMETIC = ("+", "-", "*", "/")
_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<job>\$job\b)
  | (?P<duration>(?:\d+(?:ms|s|m|h|d|w|y))+)
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[a-zA-Z_][a-zA-Z0-9_:]*)
  | (?P<punct>[(){}\[\],:+\-*/])
    """,
    re.VERBOSE,
)
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


class TemplateError(ValueError):
    """A throughput template that is not allowed; the message names the rule."""


def parse_duration(text: str) -> float:
    """Seconds of a PromQL duration such as `5m`, `1h30m` or `500ms`."""
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise TemplateError(f"{text!r} is not a duration (like 30s, 5m, 1h)")
    return float(sum(int(n) * _UNIT_S[u] for n, u in parts))


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    pos: int


def _tokens(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            ch = text[pos]
            what = "string literals and label matchers other than $job" if ch in "\"'`=~!" else repr(ch)
            raise TemplateError(f"{what} are not allowed in a throughput template (at character {pos + 1})")
        kind = m.lastgroup or ""
        if kind != "space":
            out.append(_Tok(kind, m.group(), pos))
        pos = m.end()
    return out


class _Parser:
    """Recursive descent over the template subset, with the type (scalar/vector/matrix) of each part."""

    def __init__(self, text: str, max_lookback_s: float) -> None:
        self.toks = _tokens(text)
        self.i = 0
        self.max_lookback_s = max_lookback_s
        self.selectors = 0
        self.subqueries = 0

    # -- helpers
    def peek(self, offset: int = 0) -> _Tok | None:
        j = self.i + offset
        return self.toks[j] if j < len(self.toks) else None

    def take(self, text: str | None = None, kind: str | None = None) -> _Tok:
        tok = self.peek()
        if tok is None:
            raise TemplateError(f"the template ends early (expected {text or kind})")
        if (text is not None and tok.text != text) or (kind is not None and tok.kind != kind):
            raise TemplateError(f"expected {text or kind} at character {tok.pos + 1}, found {tok.text!r}")
        self.i += 1
        return tok

    def at(self, text: str, offset: int = 0) -> bool:
        tok = self.peek(offset)
        return tok is not None and tok.text == text

    def at_kind(self, kind: str, offset: int = 0) -> bool:
        tok = self.peek(offset)
        return tok is not None and tok.kind == kind

    # -- grammar
    def parse(self) -> Kind:
        kind = self.expr()
        if (tok := self.peek()) is not None:
            raise TemplateError(f"unexpected {tok.text!r} at character {tok.pos + 1}")
        if kind == "matrix":
            raise TemplateError("the template must give an instant vector (wrap a range in rate(...))")
        if self.selectors == 0:
            raise TemplateError(
                "the template reads no series: throughput_query must read only the job's series, each metric "
                "written metric{$job}, e.g. sum(rate(train_tokens_total{$job}[5m]))"
            )
        return kind

    def expr(self) -> Kind:
        left = self.term()
        while (tok := self.peek()) is not None and tok.text in ("+", "-"):
            self.i += 1
            self._no_modifier()
            left = self._binary(left, self.term(), tok)
        return left

    def term(self) -> Kind:
        left = self.unary()
        while (tok := self.peek()) is not None and tok.text in ("*", "/"):
            self.i += 1
            self._no_modifier()
            left = self._binary(left, self.unary(), tok)
        return left

    def _binary(self, left: Kind, right: Kind, op: _Tok) -> Kind:
        if "matrix" in (left, right):
            raise TemplateError(
                f"{op.text!r} needs instant vectors or numbers, not a range (character {op.pos + 1})"
            )
        return "vector" if "vector" in (left, right) else "scalar"

    def _no_modifier(self) -> None:
        if any(self.at(word) for word in ("on", "ignoring", "group_left", "group_right", "bool")):
            raise TemplateError("vector matching modifiers (on, ignoring, group_left, bool) are not allowed")

    def unary(self) -> Kind:
        if self.at("-") or self.at("+"):
            self.i += 1
            kind = self.unary()
            if kind == "matrix":
                raise TemplateError("a sign needs an instant vector or a number, not a range")
            return kind
        return self.postfix()

    def postfix(self) -> Kind:
        before = self.subqueries
        kind = self.primary()
        if self.at("["):
            if self.subqueries > before:
                raise TemplateError("a subquery inside a subquery is not allowed")
            self.subqueries += 1
            kind = self.subquery(kind)
        tok = self.peek()
        if tok is not None and tok.kind == "name" and tok.text in ("offset", "bool"):
            raise TemplateError(f"{tok.text!r} is not allowed in a throughput template")
        return kind

    def subquery(self, kind: Kind) -> Kind:
        start = self.take("[")
        if kind != "vector":
            raise TemplateError(f"a subquery needs an instant vector (character {start.pos + 1})")
        window = self._lookback(parse_duration(self.take(kind="duration").text), "subquery range")
        self.take(":")
        if not self.at_kind("duration"):
            raise TemplateError("a subquery needs an explicit step ([range:step])")
        step = parse_duration(self.take(kind="duration").text)
        if step <= 0 or window / step > MAX_SUBQUERY_POINTS:
            raise TemplateError(f"a subquery may evaluate at most {MAX_SUBQUERY_POINTS} steps (range ÷ step)")
        self.take("]")
        return "matrix"

    def _lookback(self, seconds: float, what: str) -> float:
        if seconds <= 0:
            raise TemplateError(f"the {what} must be positive")
        if seconds > self.max_lookback_s:
            raise TemplateError(
                f"the {what} is {seconds:g} s; at most {self.max_lookback_s:g} s (THROUGHPUT_MAX_LOOKBACK_S)"
            )
        return seconds

    def primary(self) -> Kind:
        tok = self.peek()
        if tok is None:
            raise TemplateError("the template ends early")
        if tok.kind == "number":
            self.i += 1
            return "scalar"
        if tok.text == "(":
            self.i += 1
            kind = self.expr()
            self.take(")")
            return kind
        if tok.text == "{" or tok.kind == "job":
            raise TemplateError("a selector needs a metric name: metric{$job}")
        if tok.kind != "name":
            raise TemplateError(f"unexpected {tok.text!r} at character {tok.pos + 1}")
        nxt = self.peek(1)
        if tok.text in AGGREGATIONS:
            return self.aggregation()
        if nxt is not None and nxt.text == "(":
            return self.call()
        if tok.text in ("by", "without", "offset", "on", "ignoring", "and", "or", "unless", "bool"):
            raise TemplateError(f"{tok.text!r} is not allowed here (character {tok.pos + 1})")
        return self.selector()

    def selector(self) -> Kind:
        name = self.take(kind="name")
        if not self.at("{"):
            raise TemplateError(
                f"{name.text} must be written {name.text}{{$job}}: it would read every team's series"
            )
        self.take("{")
        self.take(kind="job")
        self.take("}")
        self.selectors += 1
        if self.at("[") and self.at("]", 2):  # a range; `[5m:1m]` is a subquery, left to postfix
            self.take("[")
            self._lookback(parse_duration(self.take(kind="duration").text), "range")
            self.take("]")
            return "matrix"
        return "vector"

    def _grouping(self) -> None:
        self.take("(")
        while not self.at(")"):
            validate_label_name(self.take(kind="name").text)
            if not self.at(")"):
                self.take(",")
        self.take(")")

    def aggregation(self) -> Kind:
        self.take(kind="name")
        if self.at("by") or self.at("without"):
            self.i += 1
            self._grouping()
        self.take("(")
        if self.expr() != "vector":
            raise TemplateError("an aggregation needs an instant vector")
        self.take(")")
        if self.at("by") or self.at("without"):
            self.i += 1
            self._grouping()
        return "vector"

    def call(self) -> Kind:
        name = self.take(kind="name")
        if name.text not in FUNCTIONS:
            allowed = ", ".join(sorted(FUNCTIONS | AGGREGATIONS))
            raise TemplateError(
                f"function {name.text!r} is not allowed in a throughput template; use {allowed}"
            )
        self.take("(")
        args: list[Kind] = []
        while not self.at(")"):
            args.append(self.expr())
            if not self.at(")"):
                self.take(",")
        self.take(")")
        if name.text in RANGE_FUNCTIONS:
            if args != ["matrix"]:
                raise TemplateError(f"{name.text}() takes one range, e.g. {name.text}(metric{{$job}}[5m])")
            return "vector"
        if tuple(args) not in VECTOR_FUNCTIONS[name.text]:
            raise TemplateError(f"{name.text}() does not take ({', '.join(args)})")
        return "vector"


def validate_template(text: str, *, max_lookback_s: float) -> str:
    """`text` stripped when it is an allowed throughput template; TemplateError naming the rule otherwise."""
    template = text.strip()
    if len(template) > MAX_TEMPLATE_CHARS:
        raise TemplateError(f"a throughput template has at most {MAX_TEMPLATE_CHARS} characters")
    _Parser(template, max_lookback_s).parse()
    return template


def job_matchers(external_id: str, job_label: str) -> str:
    """What `$job` expands to: `job_label="<external id>"`, the value escaped."""
    return label_matcher(validate_label_name(job_label), external_id)


def expand(template: str, matchers: str) -> str:
    """The template with `$job` replaced by the job's matchers (call on a validated template only: there
    `$job` occurs solely as a selector's whole matcher set)."""
    return template.replace(JOB_PLACEHOLDER, matchers)


def is_free_form(stored: str) -> bool:
    """True for a query stored as staff's free-form PromQL."""
    return stored.startswith(FREE_FORM_MARK)


def mark_free_form(query: str) -> str:
    """The text to store for staff's free-form PromQL (a comment line marks it; it runs as is)."""
    return FREE_FORM_MARK + query.strip()


def unmarked(stored: str) -> str:
    """The query as its author wrote it (without the free-form mark)."""
    return stored.removeprefix(FREE_FORM_MARK)


@dataclass(frozen=True)
class Runnable:
    """The PromQL to run for a job's throughput, or why none is run (`query` None)."""

    query: str | None
    reason: str = ""


def runnable_query(
    stored: str,
    external_id: str,
    *,
    job_label: str,
    max_lookback_s: float,
    validated: Callable[[str], str] | None = None,
) -> Runnable:
    """The query the server may run for a job's stored `throughput_query`: a valid template expanded with
    the job's matchers, or staff's marked free-form PromQL; otherwise None with the reason. `validated`:
    `validate_template` with this lookback, memoised by the caller (a poll cycle parses each distinct
    template once, not once per job)."""
    if not stored.strip():
        return Runnable(None, "")
    if is_free_form(stored):
        return Runnable(unmarked(stored))
    try:
        if validated is not None:
            template = validated(stored)
        else:
            template = validate_template(stored, max_lookback_s=max_lookback_s)
    except TemplateError as exc:
        return Runnable(
            None,
            f"throughput_query is not run: it is free-form PromQL not set by staff ({exc}); re-register it "
            "as a template such as sum(rate(train_tokens_total{$job}[5m]))",
        )
    return Runnable(expand(template, job_matchers(external_id, job_label)))


def own_job_selector_problem(
    selector: Mapping[str, Any], gpus: Sequence[Any], external_id: str, job_labels: Sequence[str]
) -> str | None:
    """Why a non-staff registration's GPU selection could read other jobs' GPUs, or None.

    Explicit GPUs are fine. A label selector must match one of `job_labels` exactly (a string, not a
    regex) with the job's own external id as the value: then only series carrying the job's own job
    label are read, whatever the other labels say.
    """
    if gpus:
        return None
    for name in job_labels:
        if selector.get(name) == external_id:
            return None
    return (
        "a selector must include the job's own job label as an exact match, e.g. "
        f'{{"{job_labels[0] if job_labels else "job_id"}": "{external_id}"}} (one of '
        f"{', '.join(job_labels)}; no regex on it), or list the GPUs explicitly in 'gpus'; only staff may "
        "register other selectors"
    )


# ------------------------------------------------------------------------------ one query for many jobs

#: Characters of the job-label regex of one grouped query (`grouped_query`): a 500-job cycle of 5-digit
#: ids needs ~3,000; bounded so a 10k-GPU cycle's query stays a few kB and Prometheus' set matcher small.
MAX_GROUP_REGEX_CHARS = 4000


def groupable(template: str) -> bool:
    """Whether a validated template can be read for many jobs at once by `grouped_query`.

    Exactly `sum(<expression>)`: the one aggregation is the outermost `sum` without by/without, and the
    expression reads one selector. Then every series inside carries the job label (its selector requires
    it, and the allowed functions keep labels), so `sum by (<job label>)` over the jobs' ids gives each
    job the sum its own query gives. One selector only: with two, a vector-vector operator could fail for
    one job's series (duplicate matches), and the grouped query would then fail for every job.
    """
    try:
        toks = _tokens(template.strip())
    except TemplateError:
        return False
    if len(toks) < 4 or toks[0].text != "sum" or toks[1].text != "(" or toks[-1].text != ")":
        return False
    depth = 0
    for i, tok in enumerate(toks[1:], start=1):
        depth += tok.text == "("
        depth -= tok.text == ")"
        if depth == 0 and i != len(toks) - 1:
            return False  # the outer sum closes before the end: `sum(a) + sum(b)`
    names = [t.text for t in toks[2:] if t.kind == "name"]
    if any(n in AGGREGATIONS or n in ("by", "without") for n in names):
        return False
    return sum(t.kind == "job" for t in toks) == 1


def grouped_query(template: str, job_label: str, external_ids: Sequence[str]) -> str:
    """`sum by (<job label>) (<inner>)` with `$job` as `<job label>=~"id1|id2|..."` (each id escaped, so
    it matches only itself: Prometheus anchors the regex). Call only on a `groupable` template."""
    label = validate_label_name(job_label)
    inner = template.strip()[len("sum") :].lstrip()
    matcher = regex_matcher(label, regex_any(external_ids))
    return f"sum by ({label}) {expand(inner, matcher)}"


def id_batches(external_ids: Sequence[str], max_chars: int = MAX_GROUP_REGEX_CHARS) -> list[list[str]]:
    """The ids (sorted, deduplicated) cut into batches whose escaped regex stays within `max_chars` (one
    id longer than that is a batch of its own)."""
    return regex_batches(sorted(set(external_ids)), lambda value: (value,), max_chars)
