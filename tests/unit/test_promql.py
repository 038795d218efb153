"""PromQL builder: escaping, label-name validation, and job selectors over Hostname/hostname/exported_."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from jobs.metrics.promql import (
    GpuRef,
    Matcher,
    Regex,
    Selector,
    duration,
    escape_label_value,
    gpu_key,
    label_matcher,
    label_spellings,
    promql_string,
    regex_any,
    regex_escape,
    regex_matcher,
    validate_label_name,
    validate_metric_name,
)

INJECTION = '"} or vector(1) #'
NASTY_VALUES = [INJECTION, "a\\b", 'x"y', "line\nbreak", "tab\there", "\x00\x1f\x7f", "ünïcødé", "\\", '"']
BAD_LABEL_NAMES = ["", "1abc", "a-b", "a b", 'x"', "é", "job}", "a.b", "__name__{"]


def split_literals(query: str) -> tuple[str, list[str]]:
    """Tiny PromQL lexer for tests: the query with every "..." literal emptied, and the decoded literals.

    Decodes the escapes Prometheus's lexer accepts (\\\\, \\", \\n, \\r, \\t, \\xHH). If escaping were
    wrong, a value could close its literal early and the skeleton would change.
    """
    skeleton: list[str] = []
    literals: list[str] = []
    i = 0
    while i < len(query):
        ch = query[i]
        if ch != '"':
            skeleton.append(ch)
            i += 1
            continue
        i += 1
        buf: list[str] = []
        while True:
            c = query[i]
            if c == "\n":
                raise AssertionError("raw newline inside a PromQL string")
            if c == '"':
                i += 1
                break
            if c == "\\":
                nxt = query[i + 1]
                if nxt == "x":
                    buf.append(chr(int(query[i + 2 : i + 4], 16)))
                    i += 4
                    continue
                buf.append({"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"'}[nxt])
                i += 2
                continue
            buf.append(c)
            i += 1
        skeleton.append('""')
        literals.append("".join(buf))
    return "".join(skeleton), literals


@pytest.mark.parametrize("value", NASTY_VALUES)
def test_promql_string_round_trips_any_value(value: str) -> None:
    skeleton, literals = split_literals(promql_string(value))
    assert skeleton == '""'
    assert literals == [value]


def test_escape_label_value_escapes_backslash_quote_and_newline() -> None:
    assert escape_label_value('a\\b"c\nd') == 'a\\\\b\\"c\\nd'


def test_every_character_escapes_alike_on_the_fast_path_and_the_loop() -> None:
    # The rule: backslash, quote, \n, \r, \t by name, other C0 controls and DEL as \xHH, the rest as is.
    def rule(ch: str) -> str:
        named = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
        if ch in named:
            return named[ch]
        return f"\\x{ord(ch):02x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch

    for code in [*range(0xD800), *range(0xE000, 0x30000)]:
        ch = chr(code)
        assert escape_label_value(f"job-{ch}-7") == f"job-{rule(ch)}-7", hex(code)


def test_escape_label_value_rejects_lone_surrogates_and_non_strings() -> None:
    with pytest.raises(ValueError):
        escape_label_value("\ud800")
    with pytest.raises(TypeError):
        escape_label_value(42)  # type: ignore[arg-type]


def test_injected_job_id_stays_inside_its_literal_in_label_matcher() -> None:
    skeleton, literals = split_literals(label_matcher("hpc_job", INJECTION))
    assert skeleton == 'hpc_job=""'
    assert literals == [INJECTION]


def test_injected_job_id_does_not_change_the_selector_query_shape() -> None:
    evil = Selector.from_labels({"hpc_job": INJECTION}).select("DCGM_FI_DEV_GPU_UTIL")
    plain = Selector.from_labels({"hpc_job": "48213"}).select("DCGM_FI_DEV_GPU_UTIL")
    evil_skeleton, evil_literals = split_literals(evil)
    assert evil_skeleton == split_literals(plain)[0]
    assert evil_skeleton == 'DCGM_FI_DEV_GPU_UTIL{hpc_job=""} or DCGM_FI_DEV_GPU_UTIL{exported_hpc_job=""}'
    assert evil_literals == [INJECTION, INJECTION]


def test_negated_matchers_use_bang_operators() -> None:
    assert label_matcher("pod", "x", negate=True) == 'pod!="x"'
    assert regex_matcher("pod", "x.*", negate=True) == 'pod!~"x.*"'


def test_regex_matcher_escapes_the_pattern_as_a_string_literal() -> None:
    skeleton, literals = split_literals(regex_matcher("pod", 'pretrain-7b-.*"}'))
    assert skeleton == 'pod=~""'
    assert literals == ['pretrain-7b-.*"}']


@pytest.mark.parametrize("name", BAD_LABEL_NAMES)
def test_invalid_label_names_are_rejected_everywhere(name: str) -> None:
    with pytest.raises(ValueError):
        validate_label_name(name)
    with pytest.raises(ValueError):
        label_matcher(name, "x")
    with pytest.raises(ValueError):
        regex_matcher(name, "x")
    with pytest.raises(ValueError):
        Selector.from_labels({name: "x"})
    with pytest.raises(ValueError):
        Matcher(name, "=", "x")


@pytest.mark.parametrize("name", ["gpu", "Hostname", "_x", "exported_pod", "hpc_job", "A1_b2"])
def test_valid_label_names_pass(name: str) -> None:
    assert validate_label_name(name) == name


def test_metric_names_are_validated() -> None:
    assert validate_metric_name("DCGM_FI_DEV_GPU_UTIL") == "DCGM_FI_DEV_GPU_UTIL"
    assert validate_metric_name("job:rule:rate5m") == "job:rule:rate5m"
    for bad in ["", "1x", "a-b", "x{y}", "x or vector(1)"]:
        with pytest.raises(ValueError):
            validate_metric_name(bad)
    with pytest.raises(ValueError):
        Selector.from_labels({"hpc_job": "1"}).select("x or vector(1)")


def test_matcher_rejects_unknown_operators() -> None:
    with pytest.raises(ValueError):
        Matcher("gpu", "==", "1")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "literal", ["gpu-node-1.dc1", "a+b", "(x)", "[0]", "a|b", "^$", "a{2}", "back\\slash", "*?"]
)
def test_regex_escape_matches_only_the_literal(literal: str) -> None:
    pattern = regex_escape(literal)
    assert re.fullmatch(pattern, literal)
    assert not re.fullmatch(pattern, literal + "x")
    assert not re.fullmatch(pattern, "x" + literal[1:] if len(literal) > 1 else "x")


def test_regex_any_sorts_dedups_and_escapes() -> None:
    assert regex_any(["b.x", "a", "b.x"]) == "a|b\\.x"
    with pytest.raises(ValueError):
        regex_any([])


def test_label_spellings_cover_hostname_uuid_and_exported_renames() -> None:
    assert label_spellings("Hostname") == ("Hostname", "hostname", "exported_Hostname", "exported_hostname")
    assert label_spellings("hostname") == label_spellings("Hostname")
    assert label_spellings("uuid") == ("UUID", "uuid", "exported_UUID", "exported_uuid")
    assert label_spellings("namespace") == ("namespace", "exported_namespace")
    assert label_spellings("exported_pod") == ("exported_pod",)


def test_gpu_selector_matches_every_host_label_spelling() -> None:
    sel = Selector.from_gpus([GpuRef("gpu-node-017", 3)])
    assert sel.alternatives == (
        'Hostname="gpu-node-017",gpu="3"',
        'hostname="gpu-node-017",gpu="3"',
        'exported_Hostname="gpu-node-017",gpu="3"',
        'exported_hostname="gpu-node-017",gpu="3"',
    )


def test_gpu_selector_groups_hosts_with_the_same_gpu_set() -> None:
    gpus = [{"hostname": f"node-{h}.dc1", "gpu": g} for h in range(16) for g in range(8)]
    sel = Selector.from_gpus(gpus)
    # 128 GPUs on 16 hosts with the same 8 indexes: one matcher pair per host-label spelling.
    assert len(sel.alternatives) == 4
    first = sel.alternatives[0]
    assert first.startswith('Hostname=~"node-0\\\\.dc1|node-1\\\\.dc1|')
    assert first.endswith('gpu=~"0|1|2|3|4|5|6|7"')


def test_gpu_selector_keeps_different_gpu_sets_apart() -> None:
    sel = Selector.from_gpus(
        [{"hostname": "a", "gpu": 0}, {"hostname": "a", "gpu": 1}, {"hostname": "b", "gpu": 2}]
    )
    assert 'Hostname="a",gpu=~"0|1"' in sel.alternatives
    assert 'Hostname="b",gpu="2"' in sel.alternatives
    assert len(sel.alternatives) == 8


@pytest.mark.parametrize(
    "ref",
    [{"gpu": 0}, {"hostname": "", "gpu": 0}, {"hostname": "a", "gpu": -1}, {"hostname": "a", "gpu": True},
     {"hostname": "a", "gpu": "1; drop"}, {"hostname": "a"}],
)  # fmt: skip
def test_gpu_refs_need_a_hostname_and_a_non_negative_index(ref: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Selector.from_gpus([ref])


def test_gpu_selector_needs_at_least_one_gpu() -> None:
    with pytest.raises(ValueError):
        Selector.from_gpus([])


def test_gpu_ref_accepts_capitalised_hostname_key_and_digit_strings() -> None:
    assert GpuRef.coerce({"Hostname": "n1", "gpu": "7"}) == GpuRef("n1", 7)


def test_uuid_selector_matches_uuid_spellings_without_host() -> None:
    sel = Selector.from_uuids(["GPU-1", "GPU-2"])
    assert sel.alternatives == (
        'UUID=~"GPU-1|GPU-2"',
        'uuid=~"GPU-1|GPU-2"',
        'exported_UUID=~"GPU-1|GPU-2"',
        'exported_uuid=~"GPU-1|GPU-2"',
    )


def test_label_selector_expands_to_the_product_of_spellings() -> None:
    sel = Selector.from_labels({"namespace": "llm", "pod": Regex("pretrain-7b-.*")})
    assert sel.alternatives == (
        'namespace="llm",pod=~"pretrain-7b-.*"',
        'namespace="llm",exported_pod=~"pretrain-7b-.*"',
        'exported_namespace="llm",pod=~"pretrain-7b-.*"',
        'exported_namespace="llm",exported_pod=~"pretrain-7b-.*"',
    )


def test_label_selector_accepts_compiled_patterns_and_json_regex_form() -> None:
    a = Selector.from_labels({"pod": re.compile("x-.*")})
    b = Selector.from_labels({"pod": {"regex": "x-.*"}})
    assert a == b
    assert a.alternatives[0] == 'pod=~"x-.*"'


@pytest.mark.parametrize("value", ["", Regex(".*"), Regex("a|"), 3, None, {"eq": "x"}])
def test_label_selector_rejects_values_that_would_select_the_whole_cluster_or_are_malformed(
    value: object,
) -> None:
    with pytest.raises(ValueError):
        Selector.from_labels({"hpc_job": value})


def test_label_selector_with_one_specific_matcher_may_add_broad_ones() -> None:
    sel = Selector.from_labels({"hpc_job": "1", "pod": Regex(".*")})
    assert len(sel.alternatives) == 4


def test_empty_label_selector_is_rejected() -> None:
    with pytest.raises(ValueError):
        Selector.from_labels({})


def test_select_prefers_the_first_metric_name_then_falls_back() -> None:
    q = Selector.from_labels({"hpc_job": "7"}).select(["OLD", "NEW"])
    assert (
        q == 'OLD{hpc_job="7"} or OLD{exported_hpc_job="7"} or NEW{hpc_job="7"} or NEW{exported_hpc_job="7"}'
    )


def test_select_range_wraps_every_alternative_in_the_function() -> None:
    q = Selector.from_labels({"hpc_job": "7"}).select_range("C", "rate", 300)
    assert q == 'rate(C{hpc_job="7"}[300s]) or rate(C{exported_hpc_job="7"}[300s])'
    with pytest.raises(ValueError):
        Selector.from_labels({"hpc_job": "7"}).select_range("C", "rate(x) or vector", 300)


def test_series_selectors_add_an_escaped_name_regex() -> None:
    sels = Selector.from_labels({"hpc_job": "7"}).series_selectors("DCGM_FI_.+")
    assert sels == ['{__name__=~"DCGM_FI_.+",hpc_job="7"}', '{__name__=~"DCGM_FI_.+",exported_hpc_job="7"}']


def test_duration_literals() -> None:
    assert duration(300) == "300s"
    assert duration(1.5) == "1500ms"
    for bad in [0, -1, float("nan"), float("inf")]:
        with pytest.raises(ValueError):
            duration(bad)


def test_gpu_key_prefers_unprefixed_host_labels() -> None:
    assert gpu_key({"hostname": "a", "exported_Hostname": "b", "gpu": "1"}) == ("a", "1")
    assert gpu_key({"exported_hostname": "c", "gpu": "2"}) == ("c", "2")
    assert gpu_key({"gpu": "2"}) == ("", "2")


@pytest.mark.prometheus
def test_generated_queries_parse_in_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian/Ubuntu package: prometheus)")
    exprs = [Selector.from_labels({"hpc_job": v}).select(["A", "B"]) for v in NASTY_VALUES if "\x00" not in v]
    exprs.append(
        Selector.from_gpus([{"hostname": "n.1", "gpu": 0}, {"hostname": "n2", "gpu": 1}]).select("A")
    )
    exprs.append(Selector.from_labels({"pod": Regex('a"b.*')}).select_range("C", "rate", 1.5))
    rules = "groups:\n- name: t\n  rules:\n" + "".join(
        f"  - record: r{i}\n    expr: '{e.replace(chr(39), chr(39) * 2)}'\n" for i, e in enumerate(exprs)
    )
    path = tmp_path / "rules.yml"
    path.write_text(rules)
    proc = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_selector_restricted_to_the_spellings_that_exist_keeps_only_those_alternatives() -> None:
    sel = Selector.from_gpus([{"hostname": "a", "gpu": 0}])
    assert len(sel.alternatives) == 4  # Hostname, hostname, exported_Hostname, exported_hostname
    only = sel.restricted({"Hostname", "gpu", "UUID"})
    assert only is not None and only.alternatives == ('Hostname="a",gpu="0"',)
    # `select` names the remaining alternative once: no `or` left for Prometheus to evaluate.
    assert " or " not in only.select("DCGM_FI_DEV_GPU_UTIL")
    assert sel.restricted({"gpu"}) is None  # no host spelling exists: it can match nothing
