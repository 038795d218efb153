"""throughput_query templates (jobs.metrics.throughput): what is allowed, what is refused with the rule,
how `$job` expands, and the own-job-label rule of non-staff selectors. Pure: no Django, no Prometheus."""

from __future__ import annotations

import promql_parser
import pytest

from jobs.metrics.throughput import (
    FREE_FORM_MARK,
    TemplateError,
    expand,
    job_matchers,
    mark_free_form,
    own_job_selector_problem,
    parse_duration,
    runnable_query,
    validate_template,
)

HOUR = 3600.0


@pytest.mark.parametrize(
    "template",
    [
        "sum(rate(train_tokens_total{$job}[5m]))",
        "sum by (rank) (rate(train_tokens_total{$job}[2m]))",
        "sum(rate(train_tokens_total{$job}[5m])) by (rank)",
        "avg_over_time(tokens_per_second{$job}[10m]) * 8",
        "sum(increase(train_tokens_total{$job}[1h])) / 3600",
        "clamp_min(sum(rate(a{$job}[1m])) - sum(rate(b{$job}[1m])), 0)",
        "max_over_time(sum(rate(train_tokens_total{$job}[1m]))[30m:1m])",
        "tokens_per_second{$job}",
        "-1 * -tokens_per_second{ $job }",
    ],
)
def test_allowed_templates_validate(template):
    assert validate_template(template, max_lookback_s=HOUR) == template.strip()


@pytest.mark.parametrize(
    ("template", "rule"),
    [
        ('sum(rate(train_tokens_total{job_id=~".+"}[5m]))', "label matchers other than $job"),
        ('sum(rate(train_tokens_total{$job, job_id=~".+"}[5m]))', "label matchers other than $job"),
        ("sum(rate(train_tokens_total[5m])) + sum(rate(x{$job}[5m]))", "would read every team's series"),
        ("count(up)", "would read every team's series"),
        ("sum(vector(1))", "not allowed"),
        ("2 * 3", "reads no series"),
        ("sum(rate(train_tokens_total{$job}[2h]))", "at most 3600 s (THROUGHPUT_MAX_LOOKBACK_S)"),
        ("max_over_time(rate(x{$job}[1m])[2h:1m])", "subquery range is 7200 s"),
        ("max_over_time(rate(x{$job}[1m])[1h:1s])", "at most 1000 steps"),
        ("max_over_time(rate(x{$job}[1m])[30m:])", "explicit step"),
        ("max_over_time(max_over_time(rate(x{$job}[1m])[10m:1m])[30m:1m])", "inside a subquery"),
        ('label_replace(x{$job}, "a", "b", "c", "d")', "not allowed"),
        ("absent(x{$job})", "function 'absent' is not allowed"),
        ("x{$job} offset 1h", "'offset' is not allowed"),
        ("x{$job} / on (pod) y{$job}", "vector matching modifiers"),
        ("x{$job} or y{$job}", "unexpected 'or'"),
        ("x{$job} > 0", "'>'"),
        ("rate(x{$job})", "takes one range"),
        ("x{$job}[5m]", "instant vector"),
        ("{$job}", "needs a metric name"),
        ("sum(rate(x{$job}[5m])) # comment", "'#'"),
    ],
)
def test_refused_templates_name_the_rule(template, rule):
    with pytest.raises(TemplateError, match=None) as err:
        validate_template(template, max_lookback_s=HOUR)
    assert rule in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("template", "rule"),
    [
        # Not PromQL, although the hand-written parser took them: Prometheus would fail them at every poll.
        ("sum by (rank) (x{$job}) by (pod)", "not valid PromQL"),
        ("clamp_min(x{$job}, 0,)", "trailing commas"),
        ("rate(x{$job}[30s1m])", "not a valid duration"),
        ("sum(x{$job}) by (a)(b)", "not valid PromQL"),
        # The tree walk: each node outside the subset is named.
        ("x{$job} @ 100", "'@' is not allowed"),
        ("rate(x{$job}[5m] @ end())", "'@' is not allowed"),
        ("max_over_time(rate(x{$job}[1m])[30m:1m] offset 5m)", "'offset' is not allowed"),
        ("topk(2, x{$job})", "aggregation 'topk' is not allowed"),
        ("quantile(0.9, x{$job})", "aggregation 'quantile' is not allowed"),
        ("x{$job} unless y{$job}", "unexpected 'unless'"),
        ("x{$job} ^ 2", "unexpected '^'"),
        ("x{$job} atan2 y{$job}", "unexpected 'atan2'"),
        ("x{$job} > bool 0", "unexpected '>'"),
        ("x{$job} * ignoring (pod) group_left y{$job}", "vector matching modifiers"),
        ('"x"', "string literals"),
        ("info(x{$job})", "function 'info' is not allowed"),
        # `$job` only as a selector's whole matcher set, and the sentinel it becomes cannot be written.
        ("sum by ($job) (x{$job})", "not valid PromQL"),
        ("$jobs{$job}", "not valid PromQL"),
        ('x{__efficiency_job__="job"}', "reserved"),
        ("x{$job, $job}", "label matchers other than $job"),
        ("x{$job or $job}", "label matchers other than $job"),
        ("x{$job}[0s]", "not valid PromQL"),
    ],
)
def test_the_promql_parser_and_the_tree_walk_refuse_what_the_subset_leaves_out(template, rule):
    with pytest.raises(TemplateError) as err:
        validate_template(template, max_lookback_s=HOUR)
    assert rule in str(err.value), str(err.value)
    assert "__efficiency_job__" not in str(err.value) or "reserved" in rule  # messages say $job


@pytest.mark.parametrize(
    "template",
    ["avg(x{$job}) * NaN", "x{$job} * 0x10", "sum by (rank,) (x{$job})", "round(x{$job}, 0.5)"],
)
def test_promql_the_hand_written_parser_refused_but_prometheus_accepts_is_allowed(template):
    assert validate_template(template, max_lookback_s=HOUR) == template


def test_durations_are_read_in_seconds():
    assert parse_duration("5m") == 300
    assert parse_duration("1h30m") == 5400
    assert parse_duration("500ms") == 0.5


def test_job_expands_to_the_job_label_and_the_escaped_external_id():
    assert job_matchers('demo-"x', "job_id") == 'job_id="demo-\\"x"'
    assert job_matchers("48213", "hpc_job") == 'hpc_job="48213"'


def test_a_good_template_expands_to_the_jobs_own_series():
    template = "sum(rate(train_tokens_total{$job}[120s]))"
    assert expand(template, job_matchers("demo-a", "job_id")) == (
        'sum(rate(train_tokens_total{job_id="demo-a"}[120s]))'
    )


def test_runnable_query_runs_templates_and_marked_free_form_but_not_unmarked_free_form():
    kwargs = {"job_label": "job_id", "max_lookback_s": HOUR}
    ok = runnable_query("sum(rate(t{$job}[5m]))", "j1", **kwargs)
    assert ok.query == 'sum(rate(t{job_id="j1"}[5m]))'
    free = runnable_query(mark_free_form("sum(rate(t[5m]))"), "j1", **kwargs)
    assert free.query == "sum(rate(t[5m]))" and not free.query.startswith(FREE_FORM_MARK)
    legacy = runnable_query('sum(rate(t{job_id="j2"}[5m]))', "j1", **kwargs)
    assert legacy.query is None
    assert "free-form PromQL not set by staff" in legacy.reason and "$job" in legacy.reason
    assert runnable_query("", "j1", **kwargs).query is None


def test_selector_rule_requires_the_jobs_own_label_exactly_or_explicit_gpus():
    labels = ["job_id", "hpc_job"]
    assert own_job_selector_problem({}, [{"hostname": "a", "gpu": "0"}], "48213", labels) is None
    assert own_job_selector_problem({"hpc_job": "48213"}, [], "48213", labels) is None
    assert (
        own_job_selector_problem({"hpc_job": "48213", "Hostname": {"regex": "n.*"}}, [], "48213", labels)
        is None
    )
    for bad in (
        {"Hostname": {"regex": ".+"}},
        {"hpc_job": {"regex": "48213"}},  # a regex on the job label
        {"hpc_job": "99999"},  # another job's label value
        {"namespace": "llm"},
    ):
        problem = own_job_selector_problem(bad, [], "48213", labels)
        assert problem is not None and "exact match" in problem and "gpus" in problem, bad


def _selectors(node):
    """Every vector selector under a promql-parser node."""
    if isinstance(node, promql_parser.VectorSelector):
        yield node
    elif isinstance(node, promql_parser.MatrixSelector):
        yield node.vector_selector
    elif isinstance(node, promql_parser.BinaryExpr):
        yield from _selectors(node.lhs)
        yield from _selectors(node.rhs)
    elif isinstance(node, promql_parser.Call):
        for arg in node.args:
            yield from _selectors(arg)
    elif hasattr(node, "expr"):
        yield from _selectors(node.expr)


@pytest.mark.parametrize(
    "template",
    [
        "sum(rate(train_tokens_total{$job}[5m]))",
        "clamp_min(sum(rate(a{$job}[1m])) - sum(rate(b{$job}[1m])), 0)",
        "max_over_time(sum(rate(train_tokens_total{$job}[1m]))[30m:1m])",
        "-1 * -tokens_per_second{ $job }",
    ],
)
def test_an_expanded_template_selects_only_the_jobs_own_series_even_for_a_hostile_id(template):
    """What Prometheus will run, parsed by Prometheus' grammar: every selector has exactly one matcher,
    the job label equal to the (hostile) external id, so no id can widen what the query reads."""
    import promql_parser

    hostile = 'x"} or up{job=~".+'
    query = expand(validate_template(template, max_lookback_s=HOUR), job_matchers(hostile, "job_id"))
    selectors = list(_selectors(promql_parser.parse(query)))
    assert selectors
    for selector in selectors:
        (matcher,) = selector.matchers.matchers
        assert (matcher.name, matcher.op, matcher.value) == ("job_id", promql_parser.MatchOp.Equal, hostile)
        assert not selector.matchers.or_matchers
