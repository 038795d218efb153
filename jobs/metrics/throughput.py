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
`validate_template` parses the template with promql-parser (Prometheus' grammar and type rules; what it
cannot parse is refused, e.g. a trailing comma or a duration out of order), walks the tree and refuses,
with the rule in the message:

- any label matcher other than `$job` (no `{job_id=~".+"}`, no `{__name__=~...}`), any string literal,
  any comment (`#`: the parser drops it, and a leading FREE_FORM_MARK would pass as staff's);
- a metric without `{$job}` (every vector selector reads only the job's series), or no selector at all;
- functions and aggregations outside `FUNCTIONS` / `AGGREGATIONS` (no `label_replace`, `absent`, ...),
  `offset`, `@`, vector-matching modifiers (`on`, `group_left`), comparisons and set operators;
- a range (`[5m]`) or subquery range longer than the maximum lookback; a subquery nested in another,
  without an explicit step, or of more than `MAX_SUBQUERY_POINTS` steps.

Staff may store free-form PromQL instead (`FREE_FORM_MARK` is prefixed, a PromQL comment, so the stored
text still runs as is); a free-form query without the mark (stored before templates existed, or by a
non-staff user) is not run: `runnable_query` says why, and the job's throughput is unknown with it.

Pure Python (and promql-parser), no Django: settings (lookback, job label) are passed in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import promql_parser

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

#: Range-vector functions (their one argument is a matrix), and the instant-vector ones. Nothing that
#: renames labels, reads metadata or builds series from nothing. The argument types and counts are
#: checked by the parser (Prometheus' own function table).
RANGE_FUNCTIONS = frozenset(
    {
        "rate", "irate", "increase", "delta", "idelta", "deriv", "avg_over_time", "sum_over_time",
        "min_over_time", "max_over_time", "count_over_time", "last_over_time",
    }
)  # fmt: skip
VECTOR_FUNCTIONS = frozenset({"abs", "ceil", "floor", "round", "clamp", "clamp_min", "clamp_max"})
FUNCTIONS = RANGE_FUNCTIONS | VECTOR_FUNCTIONS
AGGREGATIONS = frozenset({"sum", "avg", "min", "max", "count"})
ARITHMETIC = frozenset({"+", "-", "*", "/"})
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}

#: `$job` is not PromQL: before parsing, each `$job` becomes this matcher, and afterwards every selector
#: must carry exactly it. A label name starting with `__` is reserved by Prometheus (no exporter sets
#: one), and the template may not spell the sentinel itself, so only `$job` can produce it.
_SENTINEL_LABEL = "__efficiency_job__"
_SENTINEL_VALUE = "job"
_SENTINEL = f'{_SENTINEL_LABEL}="{_SENTINEL_VALUE}"'
_JOB_WORD = re.compile(r"\$job\b")
#: Parser messages that a template author meets most often, said as our rule (the rest pass through).
_RANGE_ARG = re.compile(r"expected type matrix in call to function '(\w+)'")


class TemplateError(ValueError):
    """A throughput template that is not allowed; the message names the rule."""


def parse_duration(text: str) -> float:
    """Seconds of a PromQL duration such as `5m`, `1h30m` or `500ms`."""
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise TemplateError(f"{text!r} is not a duration (like 30s, 5m, 1h)")
    return float(sum(int(n) * _UNIT_S[u] for n, u in parts))


def _parse(template: str) -> promql_parser.Expr:
    """The syntax tree of a template (with `$job` as the sentinel matcher), parsed by promql-parser
    (Prometheus' grammar and type rules, https://github.com/GreptimeTeam/promql-parser); TemplateError
    for anything it cannot parse or that a comment or the sentinel could hide."""
    if "#" in template:
        # A comment is dropped by the parser, so it could carry text no rule sees; a template that
        # began with FREE_FORM_MARK would also be stored as staff's free-form PromQL.
        raise TemplateError("'#' (a PromQL comment) is not allowed in a throughput template")
    if _SENTINEL_LABEL in template:
        raise TemplateError(f"{_SENTINEL_LABEL} is reserved; write metric{{$job}}")
    try:
        return promql_parser.parse(_JOB_WORD.sub(_SENTINEL, template))
    except ValueError as exc:
        message = str(exc).replace(_SENTINEL, JOB_PLACEHOLDER)
        if (m := _RANGE_ARG.search(message)) is not None:
            name = m.group(1)
            raise TemplateError(f"{name}() takes one range, e.g. {name}(metric{{$job}}[5m])") from exc
        raise TemplateError(f"not valid PromQL: {message}") from exc


class _Checker:
    """Walks a parsed template, refusing every node outside the subset, and tells each node's type."""

    def __init__(self, max_lookback_s: float) -> None:
        self.max_lookback_s = max_lookback_s
        self.selectors = 0

    def _lookback(self, window: timedelta, what: str) -> float:
        seconds = window.total_seconds()
        if seconds <= 0:
            raise TemplateError(f"the {what} must be positive")
        if seconds > self.max_lookback_s:
            raise TemplateError(
                f"the {what} is {seconds:g} s; at most {self.max_lookback_s:g} s (THROUGHPUT_MAX_LOOKBACK_S)"
            )
        return seconds

    @staticmethod
    def _no_offset_or_at(node: promql_parser.VectorSelector | promql_parser.SubqueryExpr) -> None:
        if node.offset is not None:
            raise TemplateError("'offset' is not allowed in a throughput template")
        if node.at is not None:
            raise TemplateError("'@' is not allowed in a throughput template")

    def selector(self, node: promql_parser.VectorSelector) -> None:
        name = node.name
        if not name:
            raise TemplateError("a selector needs a metric name: metric{$job}")
        matchers = node.matchers
        own = [
            m
            for m in matchers.matchers
            if m.name == _SENTINEL_LABEL
            and m.value == _SENTINEL_VALUE
            and m.op == promql_parser.MatchOp.Equal
        ]
        if not matchers.matchers and not matchers.or_matchers:
            raise TemplateError(f"{name} must be written {name}{{$job}}: it would read every team's series")
        if len(own) != 1 or len(matchers.matchers) != 1 or matchers.or_matchers:
            raise TemplateError(
                "string literals and label matchers other than $job are not allowed in a throughput "
                f"template: write {name}{{$job}}"
            )
        self._no_offset_or_at(node)
        self.selectors += 1

    def walk(self, node: promql_parser.Expr, in_subquery: bool = False) -> Kind:
        """The type of `node` after checking it and everything under it."""
        if isinstance(node, promql_parser.NumberLiteral):
            return "scalar"
        if isinstance(node, promql_parser.StringLiteral):
            raise TemplateError("string literals are not allowed in a throughput template")
        if isinstance(node, promql_parser.VectorSelector):
            self.selector(node)
            return "vector"
        if isinstance(node, promql_parser.MatrixSelector):
            self.selector(node.vector_selector)
            self._lookback(node.range, "range")
            return "matrix"
        if isinstance(node, promql_parser.SubqueryExpr):
            if in_subquery:
                raise TemplateError("a subquery inside a subquery is not allowed")
            self._no_offset_or_at(node)
            if node.range is None:  # the grammar requires one; the stubs allow None
                raise TemplateError("a subquery needs a range ([range:step])")
            window = self._lookback(node.range, "subquery range")
            if node.step is None:
                raise TemplateError("a subquery needs an explicit step ([range:step])")
            step = node.step.total_seconds()
            if step <= 0 or window / step > MAX_SUBQUERY_POINTS:
                raise TemplateError(
                    f"a subquery may evaluate at most {MAX_SUBQUERY_POINTS} steps (range ÷ step)"
                )
            self.walk(node.expr, in_subquery=True)
            return "matrix"
        if isinstance(node, promql_parser.ParenExpr | promql_parser.UnaryExpr):
            return self.walk(node.expr, in_subquery)
        if isinstance(node, promql_parser.Call):
            name = node.func.name
            if name not in FUNCTIONS:
                allowed = ", ".join(sorted(FUNCTIONS | AGGREGATIONS))
                raise TemplateError(
                    f"function {name!r} is not allowed in a throughput template; use {allowed}"
                )
            for arg in node.args:
                self.walk(arg, in_subquery)
            return "vector"
        if isinstance(node, promql_parser.AggregateExpr):
            op = str(node.op)
            if op not in AGGREGATIONS or node.param is not None:
                raise TemplateError(
                    f"aggregation {op!r} is not allowed in a throughput template; use "
                    f"{', '.join(sorted(AGGREGATIONS))}"
                )
            self.walk(node.expr, in_subquery)
            return "vector"
        if isinstance(node, promql_parser.BinaryExpr):
            op = str(node.op)
            if op not in ARITHMETIC:
                raise TemplateError(
                    f"unexpected {op!r}: a throughput template combines only with + - * / (no comparisons, "
                    "set operators (and, or, unless), %, ^ or atan2)"
                )
            if node.modifier is not None:
                raise TemplateError(
                    "vector matching modifiers (on, ignoring, group_left, bool) are not allowed"
                )
            kinds = (self.walk(node.lhs, in_subquery), self.walk(node.rhs, in_subquery))
            return "vector" if "vector" in kinds else "scalar"
        raise TemplateError(f"{type(node).__name__} is not allowed in a throughput template")


def validate_template(text: str, *, max_lookback_s: float) -> str:
    """`text` stripped when it is an allowed throughput template; TemplateError naming the rule otherwise.

    promql-parser parses it (what it cannot parse is refused); the tree is walked and every node must be
    in the subset the module docstring lists."""
    template = text.strip()
    if len(template) > MAX_TEMPLATE_CHARS:
        raise TemplateError(f"a throughput template has at most {MAX_TEMPLATE_CHARS} characters")
    checker = _Checker(max_lookback_s)
    kind = checker.walk(_parse(template))
    if kind == "matrix":
        raise TemplateError("the template must give an instant vector (wrap a range in rate(...))")
    if checker.selectors == 0:
        raise TemplateError(
            "the template reads no series: throughput_query must read only the job's series, each metric "
            "written metric{$job}, e.g. sum(rate(train_tokens_total{$job}[5m]))"
        )
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


def _selectors_and_aggregations(node: promql_parser.Expr) -> tuple[int, int]:
    """How many vector selectors and aggregations `node` holds (itself included)."""
    children: list[promql_parser.Expr] = []
    selectors = aggregations = 0
    if isinstance(node, promql_parser.VectorSelector | promql_parser.MatrixSelector):
        selectors = 1
    elif isinstance(node, promql_parser.AggregateExpr):
        aggregations = 1
        children = [node.expr]
    elif isinstance(node, promql_parser.SubqueryExpr | promql_parser.ParenExpr | promql_parser.UnaryExpr):
        children = [node.expr]
    elif isinstance(node, promql_parser.Call):
        children = list(node.args)
    elif isinstance(node, promql_parser.BinaryExpr):
        children = [node.lhs, node.rhs]
    for child in children:
        s, a = _selectors_and_aggregations(child)
        selectors += s
        aggregations += a
    return selectors, aggregations


def groupable(template: str) -> bool:
    """Whether a validated template can be read for many jobs at once by `grouped_query`.

    Exactly `sum(<expression>)`: the one aggregation is the outermost `sum` without by/without, and the
    expression reads one selector. Then every series inside carries the job label (its selector requires
    it, and the allowed functions keep labels), so `sum by (<job label>)` over the jobs' ids gives each
    job the sum its own query gives. One selector only: with two, a vector-vector operator could fail for
    one job's series (duplicate matches), and the grouped query would then fail for every job.
    """
    text = template.strip()
    if not text.startswith("sum"):  # grouped_query splices after the leading `sum`
        return False
    try:
        root = _parse(text)
    except TemplateError:
        return False
    if (
        not isinstance(root, promql_parser.AggregateExpr)
        or str(root.op) != "sum"
        or root.modifier is not None
    ):
        return False
    return _selectors_and_aggregations(root.expr) == (1, 0)


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
