"""Comparing two runs without a database: config diff, significance, KPI rows, findings diff and the trace
diff of two real Kineto samples (jobs.outputs.compare). Expected values are derived by hand in comments."""

from __future__ import annotations

import pytest

from jobs.evaluation.robust import Summary
from jobs.outputs.compare import (
    FindingFact,
    Noise,
    RunFacts,
    Value,
    config_diff,
    findings_diff,
    kpi_rows,
    mean_noise,
    noise_from_baseline,
    noise_from_samples,
    significance,
)
from jobs.outputs.compare_traces import TraceFact, kernel_name_diff, pick_traces, trace_diff
from jobs.profiling.schema.common import lenient
from jobs.profiling.schema.trace import KernelBreakdown, decode_trace
from tests.conftest import sample_path

CONFIG = {
    "model": "llama 7b lora",
    "gpu_model": "A100 SXM4 80GB",
    "gpu_count": 8,
    "dtype": "bf16",
    "tp": 1,
    "pp": 1,
    "dp": 8,
    "ep": 1,
    "micro_batch": 4,
    "global_batch": 32,
    "seq_len": 4096,
    "recompute": "none",
}


def facts(external_id: str, **over: object) -> RunFacts:
    config = {**CONFIG, **{k: v for k, v in over.items() if k in CONFIG}}
    rest = {k: v for k, v in over.items() if k not in CONFIG}
    defaults: dict[str, object] = {
        "kind": "fine_tuning",
        "flops_variant": "MFU, 6N + 12·L·H·Q·T",
        "reference_mfu": 0.45,
        "reference_source": "organisation target",
    }
    return RunFacts(external_id, config, **{**defaults, **rest})  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ config diff


def test_config_diff_highlights_what_changed_and_stays_comparable():
    diff = config_diff(facts("run1"), facts("run2", micro_batch=8, global_batch=64))
    assert diff["changed"] == ["micro_batch", "global_batch"]
    row = next(r for r in diff["rows"] if r["field"] == "micro_batch")
    assert (row["a"], row["b"], row["changed"]) == ("4", "8", True)
    assert diff["comparable"] and diff["warnings"] == []


def test_config_diff_warns_on_gpu_model_dtype_and_mfu_convention():
    b = facts(
        "run2",
        gpu_model="H100 SXM",
        dtype="fp8",
        flops_variant="MFU, 6N",
        mfu_fallback=True,
        reference_mfu=0.38,
        reference_source="organisation target for FP8",
    )
    diff = config_diff(facts("run1"), b)
    assert not diff["comparable"]
    text = " ".join(diff["warnings"])
    assert "different GPU models (A100 SXM4 80GB vs H100 SXM)" in text
    assert "different dtypes (bf16 vs fp8)" in text
    assert "different FLOPs conventions" in text and "(fallback)" in text
    # The reference MFU differs too: a note, with both references as percentages.
    assert any("45.0 %" in n and "38.0 %" in n for n in diff["notes"])


def test_config_diff_notes_a_gpu_count_change_without_making_runs_incomparable():
    diff = config_diff(facts("run1"), facts("run2", gpu_count=16, dp=16))
    assert diff["comparable"] and diff["changed"] == ["gpu_count", "dp"]
    assert any("per-GPU" in n for n in diff["notes"])


# ------------------------------------------------------------------------------------------ significance


# Eight samples per run, cut into k = min(8, 8 // 2) = 4 batches of two.
# A: batches (.29,.31) (.30,.30) (.31,.33) (.28,.30) -> means .30 .30 .32 .29; median .30;
#    |m − .30| = 0 0 .02 .01 -> median .005 -> MAD 1.4826 × .005 = .007413; σ_A = .007413 / √4 = .0037065.
# B: batches (.60,.60) (.62,.62) (.58,.58) (.64,.64) -> means .60 .62 .58 .64; median .61;
#    |m − .61| = .01 .01 .03 .03 -> median .02 -> MAD .029652; σ_B = .029652 / 2 = .014826.
# σ = √(.0037065² + .014826²) = √(1.37381e-5 + 2.19810e-4) = √2.33548e-4 = .0152823.
A = [0.29, 0.31, 0.30, 0.30, 0.31, 0.33, 0.28, 0.30]
B = [0.60, 0.60, 0.62, 0.62, 0.58, 0.58, 0.64, 0.64]


def test_noise_from_samples_uses_batch_means_of_both_runs():
    noise = noise_from_samples(A, B, step_s=30)
    assert noise.method == "samples"
    assert noise.sigma == pytest.approx(0.0152823, abs=1e-6)
    assert "8 and 8 samples every 30 s, 4 and 4 batches" in noise.detail
    sigma_a, n, k = mean_noise(A)
    assert (n, k) == (8, 4) and sigma_a == pytest.approx(0.0037065, abs=1e-7)


def test_a_doubling_of_mfu_is_beyond_noise():
    sig = significance(0.30, 0.60, noise_from_samples(A, B), "higher")
    # Half-width = max(3 × .0152823, 5 % × .30) = max(.0458469, .015) = .0458469; |Δ| = .30 > it: better.
    assert sig["band_half_width"] == pytest.approx(0.0458469, abs=1e-6)
    assert sig["beyond_noise"] is True and sig["verdict"] == "better"
    # z = .30 / .0152823 = 19.631.
    assert sig["robust_z"] == pytest.approx(19.631, abs=1e-2)


def test_a_small_change_is_within_noise_and_the_percent_floor_applies_to_steady_runs():
    # B constant at .31: σ_B = 0, σ = σ_A = .0037065; band = max(.0111195, 5 % × .30 = .015) = .015 > .01.
    noise = noise_from_samples(A, [0.31] * 8)
    assert noise.sigma == pytest.approx(0.0037065, abs=1e-7)
    sig = significance(0.30, 0.31, noise, "higher")
    assert sig["band_half_width"] == pytest.approx(0.015) and sig["verdict"] == "within noise"
    # Constant series: σ = 0, the band is 5 % of A = .015: a .02 step change is beyond it.
    flat = noise_from_samples([0.30] * 4, [0.32] * 4)
    assert flat.sigma == 0.0
    assert significance(0.30, 0.32, flat, "higher")["verdict"] == "better"


def test_noise_of_the_mean_not_of_single_samples():
    # GPU_UTIL point samples alias onto the step: single samples swing 0 <-> 0.65 every other scrape, yet
    # every batch of two averages .325: the run's mean is steady (σ = 0) and 32.5 % -> 68 % is beyond noise.
    a = [0.0, 0.65] * 8
    b = [0.36, 1.0] * 8
    noise = noise_from_samples(a, b)
    assert noise.sigma == 0.0
    assert significance(0.325, 0.68, noise, "neutral")["verdict"] == "changed"


def test_lower_is_better_and_neutral_directions():
    noise = Noise(1.0, "samples", "")
    # Step time 600 -> 500 ms: band max(3, 30) = 30 ms, |Δ| = 100: better for a lower-is-better metric.
    assert significance(600.0, 500.0, noise, "lower")["verdict"] == "better"
    assert significance(500.0, 600.0, noise, "lower")["verdict"] == "worse"
    assert significance(300.0, 400.0, noise, "neutral")["verdict"] == "changed"


def test_the_baselines_spread_over_runs_is_preferred_and_can_say_within_noise():
    # Three baseline runs at .40, .42, .44: median .42, |x − .42| = .02, 0, .02 -> median .02,
    # σ = 1.4826 × .02 = .029652; band around A = .40: max(3σ = .088956, 5 % × .40 = .02) = .088956.
    baseline = Summary(median=0.42, mad=0.029652, iqr=0.02, n=3, min=0.40, max=0.44)
    noise = noise_from_baseline(baseline, "the baseline")
    assert noise is not None and noise.method == "baseline" and "3 runs" in noise.detail
    # .40 -> .45 is +.05 < .088956: within run-to-run noise, though steady runs' samples would flag it.
    assert significance(0.40, 0.45, noise, "higher")["verdict"] == "within noise"
    assert noise_from_baseline(Summary(0.42, None, None, 1, 0.42, 0.42)) is None  # one run: no spread


def test_unknown_values_and_missing_noise_are_said_so():
    noise = noise_from_samples([0.3, 0.3, 0.3], [0.4, 0.5, 0.4, 0.5])
    assert noise.sigma is None and "too few samples to judge noise (3 and 4)" in noise.detail
    assert significance(0.3, 0.4, noise, "higher")["verdict"] == "not assessed"
    assert significance(None, 0.4, Noise(0.1, "samples", ""), "higher")["verdict"] == "unknown"


def test_kpi_rows_never_compute_a_change_against_an_unknown_or_a_lower_bound():
    a = {"mfu": Value(0.33), "waste_per_day": Value(812.0, "MFU unknown (no throughput)", lower_bound=True)}
    b = {"mfu": Value(None, "MFU unknown (no throughput)"), "waste_per_day": Value(400.0)}
    rows = {r["key"]: r for r in kpi_rows(a, b, {"mfu": Noise(0.01, "samples", "")})}
    mfu = rows["mfu"]
    assert (mfu["a_text"], mfu["b_text"], mfu["delta"], mfu["delta_text"]) == (
        "33.0 %",
        "unknown",
        None,
        "unknown",
    )
    assert mfu["b_reason"] == "MFU unknown (no throughput)" and mfu["significance"]["verdict"] == "unknown"
    waste = rows["waste_per_day"]
    assert waste["a_text"] == "at least $812/day" and waste["b_text"] == "$400/day"
    assert waste["delta"] is None and waste["significance"]["verdict"] == "not measured"


def test_kpi_rows_change_in_points_and_percent():
    # MFU .33 -> .68: Δ = +.35 = +35.0 pts; relative +.35 / .33 = +106.06 %.
    rows = kpi_rows({"mfu": Value(0.33)}, {"mfu": Value(0.68)}, {"mfu": Noise(0.01, "samples", "")})
    mfu = next(r for r in rows if r["key"] == "mfu")
    assert mfu["delta_text"] == "+35.0 pts" and mfu["delta_pct"] == pytest.approx(106.0606, abs=1e-3)
    # Band max(.03, .0165) = .03 < .35: better.
    assert mfu["significance"]["verdict"] == "better"
    cost = next(r for r in rows if r["key"] == "cost_per_day")
    assert cost["a_text"] == "unknown" and cost["a_reason"] == "not available"


# ------------------------------------------------------------------------------------------ findings diff


def test_findings_diff_resolved_new_persisting_with_dollars():
    a = [
        FindingFact("data_pipeline_stall", "Input stall", "critical", 1200.0),
        FindingFact("false_saturation", "Busy but not saturated", "warning", None),
        FindingFact("launch_overhead", "Tiny kernels", "warning", 300.0),
    ]
    b = [
        FindingFact("launch_overhead", "Tiny kernels", "warning", 450.0),
        FindingFact("memory_headroom", "Memory unused", "info", 80.0),
    ]
    diff = findings_diff(a, b)
    assert [i["code"] for i in diff["resolved"]] == ["data_pipeline_stall", "false_saturation"]
    assert [i["code"] for i in diff["new"]] == ["memory_headroom"]
    persisting = diff["persisting"][0]
    # launch_overhead 300 -> 450 $/day: +$150/day.
    assert persisting["code"] == "launch_overhead" and persisting["delta_usd_per_day"] == 150.0
    assert persisting["delta_text"] == "+$150/day"
    # Resolved: $1,200 known + one of unknown impact (never counted as $0).
    resolved = diff["totals"]["resolved"]
    assert resolved["usd_per_day"] == 1200.0 and resolved["unknown"] == 1
    assert resolved["text"] == "$1,200/day + 1 of unknown impact"
    assert diff["resolved"][1]["a_text"] == "impact unknown"
    assert diff["totals"]["new"]["text"] == "$80.00/day"


# --------------------------------------------------------------------------------------------- trace diff


def test_kernel_name_diff_follows_htas_categories_and_never_invents_zeros():
    # A lists all of its 3 kernels; B lists 2 of its 5 (its top 2 by time).
    kb_a = {
        "distinct_kernels": 3,
        "top_kernels": [
            {"name": "gemm", "count": 10, "total_ms": 50.0},
            {"name": "softmax", "count": 10, "total_ms": 5.0},
            {"name": "old_kernel", "count": 4, "total_ms": 2.0},
        ],
    }
    kb_b = {
        "distinct_kernels": 5,
        "top_kernels": [
            {"name": "gemm", "count": 12, "total_ms": 40.0},
            {"name": "fused", "count": 1, "total_ms": 9.0},
        ],
    }
    diff = kernel_name_diff(lenient(kb_a, KernelBreakdown), lenient(kb_b, KernelBreakdown))
    rows = {r["name"]: r for r in diff["rows"]}
    # gemm: in both, 10 -> 12 launches (increased, HTA's count category), 50 -> 40 ms (faster, −10 ms).
    assert (rows["gemm"]["change"], rows["gemm"]["timing"], rows["gemm"]["diff_time_ms"]) == (
        "increased",
        "faster",
        -10.0,
    )
    # fused: A lists every kernel it has, so fused is absent from A: added, 0 -> 9 ms (+9).
    assert rows["fused"]["change"] == "added" and rows["fused"]["diff_time_ms"] == 9.0
    # softmax and old_kernel are not in B's top 2 of 5: unknown there, not 0 and not "removed".
    assert rows["softmax"]["change"] == "not in B's top 2" and rows["softmax"]["b_time_ms"] is None
    assert rows["softmax"]["diff_time_ms"] is None
    # Known changes first by size (|−10| > 9), unknown ones after.
    assert [r["name"] for r in diff["rows"]][:2] == ["gemm", "fused"]


def _analysis(name: str) -> dict:
    from jobs.profiling import kineto, trace_analysis

    return trace_analysis.analyze_trace(kineto.parse_kineto(sample_path(f"kineto/{name}")))


@pytest.fixture(scope="module")
def two_ranks() -> tuple[dict, dict]:
    return (_analysis("hta_128rank_sampled_rank0.json.gz"), _analysis("hta_128rank_sampled_rank1.json.gz"))


def test_trace_diff_of_two_real_samples(two_ranks):
    a, b = two_ranks
    ta = TraceFact(1, "kineto", "rank0.json.gz", 0, "2026-12-01T00:00:00Z", decode_trace(a))
    tb = TraceFact(2, "kineto", "rank1.json.gz", 1, "2026-12-01T00:00:00Z", decode_trace(b))
    diff = trace_diff(ta, tb)
    assert diff["available"] and diff["kind"] == "kineto"
    ra, rb = a["ranks"][0], b["ranks"][0]
    # The two files hold different ranks (0 and 1): each file's GPU rank is used.
    assert (diff["a"]["rank"], diff["b"]["rank"]) == (ra["rank"], rb["rank"]) == (0, 1)

    def row(section: str, key: str) -> dict:
        return next(r for r in diff[section] if r["key"] == key)

    # Every delta is B's own number minus A's own number, in the section's unit.
    for section, source, key in (
        ("temporal", "temporal_breakdown", "idle_pct"),
        ("temporal", "temporal_breakdown", "compute_ms"),
        ("idle", "idle_breakdown", "host_wait_pct"),
        ("step", "step_breakdown", "communication_pct"),
        ("gpu_idle_attribution", "gpu_idle_attribution", "launch_gaps_pct"),
        ("host_blocking", "host_blocking", "blocked_ms"),
    ):
        r = row(section, key)
        assert (r["a"], r["b"]) == (ra[source][key], rb[source][key])
        assert r["delta"] == pytest.approx(rb[source][key] - ra[source][key], abs=1e-4)
    # Step median from the ProfilerSteps of each trace.
    assert row("step", "median_ms")["delta"] == pytest.approx(
        rb["step_times"]["median_ms"] - ra["step_times"]["median_ms"], abs=1e-4
    )
    # Kernel categories: COMPUTATION and COMMUNICATION rows are each trace's by_class numbers.
    classes = {r["name"]: r for r in diff["kernel_classes"]}
    for c in ra["kernel_breakdown"]["by_class"]:
        other = next(x for x in rb["kernel_breakdown"]["by_class"] if x["kernel_class"] == c["kernel_class"])
        got = classes[c["kernel_class"]]
        assert got["diff_time_ms"] == pytest.approx(other["time_ms"] - c["time_ms"], abs=1e-4)
        assert got["diff_count"] == other["count"] - c["count"]
    # Launch statistics: kernel count and launch delay p50 from each trace's own numbers.
    assert (
        row("launch", "kernel_count")["delta"]
        == rb["kernel_breakdown"]["kernel_count"] - ra["kernel_breakdown"]["kernel_count"]
    )
    assert row("launch", "launch_delay.p50_us")["delta"] == pytest.approx(
        rb["launch_stats"]["launch_delay"]["p50_us"] - ra["launch_stats"]["launch_delay"]["p50_us"], abs=1e-4
    )
    # Kernels by name: the top 20 of each; a kernel in both tops changes by its own totals, one missing
    # from a top list of a trace with more distinct kernels than listed is "not in ... top 20", not 0.
    kernels = diff["kernels"]
    assert kernels["listed_a"] == 20 and not kernels["complete_a"] and len(kernels["rows"]) <= 20
    top_a = {k["name"]: k for k in ra["kernel_breakdown"]["top_kernels"]}
    top_b = {k["name"]: k for k in rb["kernel_breakdown"]["top_kernels"]}
    for r in kernels["rows"]:
        if r["name"] in top_a and r["name"] in top_b:
            assert r["diff_time_ms"] == pytest.approx(
                top_b[r["name"]]["total_ms"] - top_a[r["name"]]["total_ms"], abs=1e-4
            )
            assert r["change"] in ("increased", "decreased", "unchanged")
        else:
            assert r["diff_time_ms"] is None and r["change"].startswith("not in")
    nccl = next(r for r in kernels["rows"] if r["short_name"].startswith("ncclKernel_SendRecv"))
    # The SendRecv kernel: 195.327 ms in rank 0, 168.027 ms in rank 1 (their by-name totals): −27.3 ms.
    assert nccl["timing"] == "faster" and nccl["diff_time_ms"] == pytest.approx(-27.3, abs=1e-3)


def test_pick_traces_needs_the_same_kind_in_both_runs():
    k = TraceFact(1, "kineto", "a.json", 0, "")
    n = TraceFact(2, "nsys_sqlite", "b.sqlite", None, "")
    ta, tb, reason = pick_traces([k], [n])
    assert ta is None and tb is None and "A: kineto; B: nsys_sqlite" in reason
    assert pick_traces([n, k], [k])[:2] == (k, k)


def test_a_malformed_trace_analysis_reads_as_unknown_instead_of_failing_the_diff():
    # The dict reader raised AttributeError on a block stored as a number; the typed one reads it as
    # unknown, keeps the well-formed numbers beside it and drops the junk list entry.
    bad = {
        "ranks": [
            {
                "rank": 0,
                "has_gpu_kernels": True,
                "launch_stats": 3.5,
                "window": "x",
                "kernel_breakdown": {
                    "kernel_count": 10,
                    "distinct_kernels": 1,
                    "top_kernels": ["junk", {"name": "gemm", "count": 2, "total_ms": 1.0}],
                },
            }
        ]
    }
    good = {
        "ranks": [
            {
                "rank": 0,
                "has_gpu_kernels": True,
                "launch_stats": {"launches": 12, "launch_delay": {"p50_us": 4.0}},
                "window": {"profiler_steps": 3},
                "kernel_breakdown": {
                    "kernel_count": 12,
                    "distinct_kernels": 1,
                    "top_kernels": [{"name": "gemm", "count": 3, "total_ms": 1.5}],
                },
            }
        ]
    }
    diff = trace_diff(
        TraceFact(1, "kineto", "a.json", 0, "", decode_trace(bad)),
        TraceFact(2, "kineto", "b.json", 0, "", decode_trace(good)),
    )
    launch = {r["key"]: r for r in diff["launch"]}
    assert (launch["launches"]["a"], launch["launches"]["b"], launch["launches"]["delta"]) == (
        None,
        12.0,
        None,
    )
    assert launch["kernel_count"]["delta"] == 2.0
    assert launch["launch_delay.p50_us"]["a"] is None and launch["launch_delay.p50_us"]["b"] == 4.0
    assert diff["a"]["window"] == {} and diff["b"]["window"] == {"profiler_steps": 3}
    (gemm,) = diff["kernels"]["rows"]
    assert (gemm["name"], gemm["change"], gemm["diff_time_ms"]) == ("gemm", "increased", 0.5)


def test_every_trace_diff_row_reads_the_stored_key_it_is_named_for():
    # A row's `key` is the stored key (dotted when nested) the page and the API name it by; its typed
    # read must take exactly that number.
    from jobs.outputs import compare_traces as CT
    from jobs.profiling.schema import trace as TS

    tables = {
        TS.TemporalBreakdown: CT._TEMPORAL,
        TS.IdleBreakdown: CT._IDLE,
        TS.StepTimes: CT._STEP_TIMES,
        TS.StepBreakdown: CT._STEP,
        TS.GpuIdleAttribution: CT._ATTRIBUTION,
        TS.HostBlocking: CT._HOST,
        TS.KernelBreakdown: CT._KERNELS,
        TS.LaunchStats: CT._LAUNCH,
        TS.TinyKernels: CT._TINY,
        TS.CommComputeOverlap: CT._OVERLAP,
    }
    for cls, metrics in tables.items():
        for metric in metrics:
            payload: dict = {}
            *outer, leaf = metric.key.split(".")
            inner = payload
            for part in outer:
                inner = inner.setdefault(part, {})
            inner[leaf] = 42.5
            assert metric.read(lenient(payload, cls)) == 42.5, (cls.__name__, metric.key)
            assert metric.read(cls()) is None, (cls.__name__, metric.key)
