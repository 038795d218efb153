"""Diagnosis rules on simulated jobs (converted to what ingestion archives) and on artifact analyses.

Each code: a positive case, a healthy negative, a missing-signal case (lower confidence, names what is
missing), noisy/gappy data; plus the engine's dollars and symptom handling. Pure: no Django, no Prometheus.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import numpy as np
import pytest

from benchmarks.diagnosis_inputs import blank_profiling, input_from_sim, signals_from_sim
from jobs.diagnosis import CODES, ArtifactAnalysis, DiagnosisInput, Finding, Severity, diagnose
from jobs.diagnosis import engine as E
from jobs.diagnosis.features import Features
from jobs.diagnosis.rules import RULES
from jobs.metrics.signals import DEFAULT_DISABLED, SignalSeries
from jobs.simulate import SCENARIOS, SimSpec, simulate

METRIC_CODES = [s.code for s in SCENARIOS.values() if s.code]


@functools.lru_cache(maxsize=128)
def _sim_input(
    scenario: str,
    gpus: int,
    seed: int,
    noise: float,
    missing: float,
    disabled: frozenset[str],
    per_gpu: bool,
    params: tuple[tuple[str, Any], ...],
) -> DiagnosisInput:
    hosts = tuple(f"node-{h}" for h in range(-(-gpus // 8)))
    res = simulate(
        SimSpec(
            scenario=scenario,
            gpus=gpus,
            seed=seed,
            noise=noise,
            missing_fraction=missing,
            disabled=disabled,
            hosts=hosts,
            params=dict(params),
        )
    )
    return input_from_sim(res, signals=signals_from_sim(res, per_gpu=per_gpu))


def sim_input(
    scenario: str,
    *,
    gpus: int = 8,
    seed: int = 3,
    noise: float = 0.02,
    missing: float = 0.0,
    disabled: frozenset[str] | set[str] = frozenset(),
    per_gpu: bool = True,
    **params: Any,
) -> DiagnosisInput:
    """A DiagnosisInput for a simulated job (cached; copied so tests may change it)."""
    inp = _sim_input(
        scenario, gpus, seed, noise, missing, frozenset(disabled), per_gpu, tuple(sorted(params.items()))
    )
    return copy.copy(inp)


def run(code: str, inp: DiagnosisInput) -> Finding | None:
    """One rule on one input."""
    return RULES[code](inp, Features(inp))


def at_least_warning(f: Finding | None) -> bool:
    return f is not None and f.severity.rank >= Severity.WARNING.rank


# ------------------------------------------------------------------------------ metric scenarios


@pytest.mark.parametrize("code", METRIC_CODES)
def test_each_scenario_is_found_by_its_rule(code):
    f = run(code, sim_input(code))
    assert at_least_warning(f), f
    assert f.code == code and f.confidence >= 0.6 and f.missing_signals == []
    assert f.evidence and any(e.unit for e in f.evidence) and f.windows
    assert f.recommendation and f.title and 0.0 <= f.impact <= 1.0


@pytest.mark.parametrize("code", CODES)
def test_a_healthy_job_triggers_no_rule(code):
    for seed, gpus in ((1, 4), (2, 8), (3, 16)):
        assert run(code, sim_input("healthy", seed=seed, gpus=gpus, noise=0.05)) is None


@pytest.mark.parametrize("code", METRIC_CODES)
def test_each_scenario_survives_heavy_noise_and_lost_scrapes(code):
    f = run(code, sim_input(code, gpus=16, noise=0.1, missing=0.2, seed=11))
    assert at_least_warning(f), f


@pytest.mark.parametrize("code", METRIC_CODES)
def test_a_healthy_job_with_heavy_noise_and_lost_scrapes_gets_no_warning(code):
    f = run(code, sim_input("healthy", gpus=12, noise=0.1, missing=0.2, seed=5))
    assert not at_least_warning(f), f


MISSING_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "false_saturation": ({"disabled": {"sm_active"}}, "sm_active"),
    "launch_overhead": ({"disabled": {"sm_active"}}, "sm_active"),
    "tensor_cores_idle": ({"disabled": {"sm_active"}}, "sm_active"),
    "memory_bound": ({"disabled": {"tensor_active"}}, "tensor_active"),
    "throttling": ({"disabled": DEFAULT_DISABLED}, "clock_throttle_reasons"),
    "communication_wait": ({"disabled": {"sm_active"}}, "sm_active"),
    "straggler": ({"disabled": {"sm_active"}}, "sm_active"),
    "memory_headroom": ({"disabled": {"fb_free"}}, "fb_free"),
    "data_pipeline_stall": ({"disabled": {"gpu_util"}}, "gpu_util"),
    "idle_gpus": ({"per_gpu": False}, "per-GPU series"),
    "gpu_errors": ({"per_gpu": False}, "per-GPU series"),
}


@pytest.mark.parametrize("code", sorted(MISSING_CASES))
def test_a_missing_signal_lowers_confidence_and_is_named(code):
    kwargs, name = MISSING_CASES[code]
    full = run(code, sim_input(code))
    partial = run(code, sim_input(code, **kwargs))
    assert full is not None and partial is not None, (full, partial)
    assert name in partial.missing_signals
    assert partial.confidence < full.confidence


def test_without_sm_active_the_default_exporter_still_separates_the_look_alikes():
    # No SM_ACTIVE: launch overhead (pipes quiet) vs tensor cores idle (DRAM busy) vs false saturation.
    for scenario in ("false_saturation", "launch_overhead", "tensor_cores_idle", "memory_bound"):
        found = {
            f.code
            for f in diagnose(sim_input(scenario, disabled=DEFAULT_DISABLED, noise=0.05))
            if f.severity.rank >= 1
        }
        assert found == {scenario}, (scenario, found)


def test_data_stalls_and_collective_waits_are_told_apart():
    stall, comm = sim_input("data_pipeline_stall", stall_every=5), sim_input("communication_wait")
    assert run("communication_wait", stall) is None
    assert run("data_pipeline_stall", comm) is None
    f = run("data_pipeline_stall", stall)
    assert f is not None and any(e.label == "gap period" and e.value == 150 for e in f.evidence)
    c = run("communication_wait", comm)
    assert c is not None and "240 s" in c.title


def test_a_node_straggler_is_named():
    f = run("straggler", sim_input("straggler", gpus=24, straggler_scope="node"))
    assert at_least_warning(f)
    assert "node-2" in f.title or any("node-2" in e.label for e in f.evidence)


def test_one_slow_gpu_is_a_straggler_not_a_job_wide_throttle():
    inp = sim_input("straggler", gpus=16)
    assert run("throttling", inp) is None
    f = run("straggler", inp)
    assert f is not None and "node-1/7" in f.title
    assert any("hw_thermal" in str(e.value) for e in f.evidence)


def test_idle_gpus_are_named_with_their_window_and_stalls_are_not_idle_gpus():
    inp = sim_input("idle_gpus", gpus=8, idle_from=0.5)
    f = run("idle_gpus", inp)
    assert f is not None and "2 of 8 GPUs" in f.title
    start = inp.signals.timestamps[0]
    assert f.window_start >= start + 0.45 * 3600
    assert run("idle_gpus", sim_input("data_pipeline_stall")) is None


def test_xid_severity_depends_on_the_code():
    hw = run("gpu_errors", sim_input("gpu_errors", xid=79))
    app = run("gpu_errors", sim_input("gpu_errors", xid=13))
    assert hw.severity is Severity.CRITICAL and "79" in hw.title
    assert app.severity is Severity.WARNING and "13" in app.title
    assert any(e.label.endswith(": XID") for e in hw.evidence)


def test_throttling_without_a_catalog_max_clock_uses_the_highest_clock_seen():
    inp = sim_input("throttling")
    inp.max_clock_mhz = None
    f = run("throttling", inp)
    full = run("throttling", sim_input("throttling"))
    assert f is not None and f.confidence < full.confidence
    assert any("highest clock seen" in e.label for e in f.evidence)


def _with_constant_clock(inp: DiagnosisInput, sm_mhz: float, reported_max_mhz: float | None = None):
    """`inp` (a healthy H100 job) with every GPU's SM clock at `sm_mhz`, optionally with a reported max."""
    sigs = copy.deepcopy(inp.signals)
    assert sigs is not None
    clock = sigs.signals["sm_clock"]
    const = {k: np.full_like(v, sm_mhz) for k, v in clock.stats.items()}
    clock.stats = const
    if clock.per_gpu is not None:
        clock.per_gpu = np.full_like(clock.per_gpu, sm_mhz)
    if reported_max_mhz is not None:
        ts = clock.timestamps
        stats = {k: np.full_like(ts, reported_max_mhz) for k in ("mean", "min", "max")}
        sigs.signals["max_sm_clock"] = SignalSeries("max_sm_clock", "MHz", ts, stats)
    out = copy.copy(inp)
    out.signals = sigs
    return out


def test_h100_at_its_peaks_clock_of_1830_mhz_is_not_throttled():
    # 1830 / 1980 = 0.9242: 7.6 % below the max boost. That is the clock NVIDIA's 989.5 TFLOP/s peak
    # assumes, so the GPU delivers its full quoted peak there; GPU Boost steps down a few bins under heavy
    # tensor load without any power or thermal fault. The rule's line is CLOCK_RATIO_LOW = 0.85 (1683 MHz):
    # 1830 is above it, so no finding.
    inp = _with_constant_clock(sim_input("healthy"), 1830.0)
    assert inp.max_clock_mhz == 1980.0
    assert round(1830 / 1980, 4) == 0.9242
    assert run("throttling", inp) is None


def test_h100_at_1600_mhz_is_throttled_against_the_1980_max_boost():
    # 1600 / 1980 = 0.8081 < 0.85. (Against the old single 1830 MHz "boost" it read 0.874: missed.)
    f = run("throttling", _with_constant_clock(sim_input("healthy"), 1600.0))
    assert f is not None
    evidence = {e.label: e.value for e in f.evidence}
    assert evidence["max boost clock (GPU catalog)"] == 1980
    assert evidence["clock / max boost"] == pytest.approx(80.8)


def test_throttling_prefers_the_max_clock_the_gpus_report_over_the_catalog():
    # The GPUs report DCGM_FI_DEV_MAX_SM_CLOCK 1755 MHz (a lower-clocked part than the catalog row):
    # 1600 / 1755 = 0.9117 >= 0.85, not throttled; 1400 / 1755 = 0.7977 < 0.85, throttled.
    healthy = sim_input("healthy")
    assert run("throttling", _with_constant_clock(healthy, 1600.0, reported_max_mhz=1755.0)) is None
    f = run("throttling", _with_constant_clock(healthy, 1400.0, reported_max_mhz=1755.0))
    assert f is not None
    evidence = {e.label: e.value for e in f.evidence}
    assert evidence["max boost clock (reported by the GPUs, DCGM_FI_DEV_MAX_SM_CLOCK)"] == 1755
    assert evidence["clock / max boost"] == pytest.approx(79.8)


def test_tensor_cores_idle_needs_a_tensor_core_dtype():
    inp = sim_input("tensor_cores_idle")
    inp.dtype = "fp32"
    assert run("tensor_cores_idle", inp) is None
    # The catalog's one dtype table: a Lightning "bf16-mixed" job is a bf16 job here too.
    inp.dtype = "bf16-mixed"
    mixed = run("tensor_cores_idle", inp)
    inp.dtype = "bf16"
    plain = run("tensor_cores_idle", inp)
    assert mixed is not None and plain is not None and mixed.severity == plain.severity


# ---------------------------------------------------------------------------- profiler captures


def test_a_profiler_capture_is_a_gap_not_idle_and_not_a_finding():
    res = blank_profiling(simulate(SimSpec(scenario="healthy", gpus=8, seed=2, hosts=("n1",))), 0.3, 0.6)
    inp = input_from_sim(res)
    f = Features(inp)
    # Prometheus's 5-minute lookback repeats the last profiling sample into the first minutes of the blank.
    assert f.capture_runs and f.capture_mask.mean() == pytest.approx(0.3 - 300 / 3630, abs=0.02)
    assert not [x for x in diagnose(inp) if x.severity.rank >= 1]


def test_a_capture_does_not_hide_a_real_problem():
    res = blank_profiling(
        simulate(SimSpec(scenario="false_saturation", gpus=8, seed=2, hosts=("n1",))), 0.2, 0.5
    )
    f = run("false_saturation", input_from_sim(res))
    assert at_least_warning(f)


# ------------------------------------------------------------------------------------- baseline


def baseline(median: float, mad: float = 0.01) -> dict[str, Any]:
    return {"mfu": {"median": median, "mad": mad, "iqr": mad * 1.3, "n": 4}}


def test_baseline_regression_fires_below_the_band_and_not_within_or_above():
    inp = sim_input("healthy")
    inp.baseline = baseline(0.6)
    f = run("baseline_regression", inp)
    assert (
        at_least_warning(f)
        and f.title.startswith("MFU 25 % worse")
        and f.impact == pytest.approx(0.25, abs=0.02)
    )
    inp.baseline = baseline(0.45)
    assert run("baseline_regression", inp) is None
    inp.baseline = baseline(0.3)
    assert run("baseline_regression", inp) is None  # an improvement
    inp.baseline = {"mfu": {"median": "broken"}, "other": 3}
    assert run("baseline_regression", inp) is None


def test_baseline_regression_without_mfu_uses_hardware_activity_at_lower_confidence():
    inp = sim_input("false_saturation")
    inp.baseline = {"sm_active": {"median": 0.9, "mad": 0.01, "n": 3}}
    inp.mfu = None
    f = run("baseline_regression", inp)
    assert f is not None and f.severity is Severity.INFO and "mfu" in f.missing_signals
    inp2 = sim_input("false_saturation")
    inp2.baseline = {"mfu": {"median": 0.45, "mad": 0.01, "n": 3}, "sm_active": {"median": 0.9, "mad": 0.01}}
    assert run("baseline_regression", inp2).confidence > f.confidence


def test_baseline_regression_window_starts_at_the_drop():
    inp = sim_input("healthy")
    mfu = inp.signals.get("mfu").stats["mean"].copy()
    mfu[len(mfu) // 2 :] *= 0.6
    inp.signals = copy.copy(inp.signals)
    inp.signals.signals = dict(inp.signals.signals)
    inp.signals.signals["mfu"] = copy.copy(inp.signals.signals["mfu"])
    inp.signals.signals["mfu"].stats = {"mean": mfu}
    inp.mfu = float(np.mean(mfu))
    inp.baseline = baseline(0.45)
    f = run("baseline_regression", inp)
    middle = inp.signals.timestamps[len(mfu) // 2]
    assert f is not None and abs(f.window_start - middle) <= 120
    assert any(e.label == "MFU level shift at" and abs(e.value - middle) <= 120 for e in f.evidence)


# ------------------------------------------------------------------------------------ artifacts


def trace(**rank: Any) -> ArtifactAnalysis:
    """A Kineto trace analysis with one rank; unspecified sections are healthy."""
    base: dict[str, Any] = {
        "rank": 0,
        "temporal_breakdown": {
            "idle_pct": 5.0,
            "compute_pct": 90.0,
            "non_compute_pct": 5.0,
            "compute_ms": 900.0,
            "non_compute_ms": 50.0,
            "span_ms": 1000.0,
        },
        "idle_breakdown": {"host_wait_pct": 20.0, "kernel_wait_pct": 80.0},
        "kernel_breakdown": {"kernel_count": 2000, "tiny_kernels": {"count_pct": 10.0}},
        "launch_stats": {"gpu_shorter_than_launch_pct": 5.0},
        "memcpy": {"by_kind": [], "pageable_bytes_pct": None},
        "sync": {"cpu_sync_calls": 0, "cpu_sync_ms": 0.0},
        "comm_compute_overlap": {"communication_ms": 0.0, "overlap_pct": None},
        "tensor_cores": {"tensor_core_compute_time_pct": 80.0},
        "step_times": {"count": 5, "median_ms": 200.0},
        "step_breakdown": {"steps": 5, "dataloader_pct": 0.0},
    }
    for section, values in rank.items():
        base[section] = {**base.get(section, {}), **values} if isinstance(values, dict) else values
    return ArtifactAnalysis("kineto", {"ranks": [base]}, "trace.json.gz", 0)


def art_input(*arts: ArtifactAnalysis, **kw: Any) -> DiagnosisInput:
    return DiagnosisInput(signals=None, gpu_count=8, artifacts=arts, **kw)


def test_a_healthy_trace_triggers_nothing():
    assert diagnose(art_input(trace())) == []


@pytest.mark.parametrize(
    ("code", "sections"),
    [
        (
            "launch_overhead",
            {
                "kernel_breakdown": {"tiny_kernels": {"count_pct": 70.0}},
                "temporal_breakdown": {"idle_pct": 30.0},
                "idle_breakdown": {"kernel_wait_pct": 60.0},
            },
        ),
        ("communication_wait", {"comm_compute_overlap": {"communication_ms": 250.0, "overlap_pct": 10.0}}),
        ("host_sync", {"sync": {"cpu_sync_calls": 40, "cpu_sync_ms": 300.0}}),
        (
            "host_device_copy",
            {"memcpy": {"by_kind": [{"copy_kind": "HtoD", "time_ms": 200.0}], "pageable_bytes_pct": 100.0}},
        ),
        (
            "data_pipeline_stall",
            {
                "temporal_breakdown": {"idle_pct": 40.0},
                "idle_breakdown": {"host_wait_pct": 90.0},
                "step_breakdown": {"dataloader_pct": 35.0},
            },
        ),
    ],
)
def test_trace_analyses_alone_produce_findings(code, sections):
    found = {f.code: f for f in diagnose(art_input(trace(**sections)))}
    assert code in found and found[code].severity.rank >= 1
    assert any(s.endswith("trace") for s in found[code].sources)


def test_pageable_copies_change_the_recommendation():
    f = run(
        "host_device_copy",
        art_input(
            trace(memcpy={"by_kind": [{"copy_kind": "HtoD", "time_ms": 200.0}], "pageable_bytes_pct": 100.0})
        ),
    )
    assert f.recommendation.startswith("Most copies use pageable host memory")


def test_other_artifacts_ncu_nsys_stats_and_pyspy():
    ncu = ArtifactAnalysis("ncu_csv", {"format": "ncu_csv", "bound_time_share_pct": {"memory": 70.0}})
    stats = ArtifactAnalysis(
        "nsys_stats_csv",
        {
            "format": "nsys_stats_csv",
            "kernels": {
                "tiny_instance_share_pct": 80.0,
                "nccl_time_share_pct": 30.0,
                "total_time_ms": 100.0,
                "instances": 1000,  # launch_overhead reads a summary of at least MIN_TRACE_KERNELS launches
            },
            "cuda_api": {"sync_calls": 50, "sync_share_of_api_pct": 40.0},
        },
    )
    py = ArtifactAnalysis(
        "pyspy_speedscope",
        {
            "classes_pct": {"tokenization": 60.0},
            "input_pipeline_pct": 60.0,
            "hot_inclusive": [{"label": "encode (tok.py)", "class": "tokenization", "inclusive_pct": 55.0}],
        },
    )
    codes = {f.code: f for f in diagnose(art_input(ncu, stats, py))}
    assert {
        "memory_bound",
        "launch_overhead",
        "communication_wait",
        "host_sync",
        "data_pipeline_stall",
    } <= set(codes)
    assert any("encode" in e.label for e in codes["data_pipeline_stall"].evidence)


@pytest.mark.parametrize(
    "analysis",
    [
        {},
        {"ranks": "x"},
        {"ranks": [None, 3, {"temporal_breakdown": "bad"}]},
        {
            "ranks": [
                {
                    "temporal_breakdown": {"span_ms": "1", "idle_pct": None},
                    "sync": [],
                    "memcpy": {"by_kind": [1, None]},
                }
            ]
        },
        {"format": "ncu_csv", "bound_time_share_pct": None},
        {"classes_pct": 1, "input_pipeline_pct": "lots"},
    ],
)
def test_malformed_analyses_are_ignored(analysis):
    assert diagnose(art_input(ArtifactAnalysis("kineto", analysis))) == []


def test_pyspy_plus_metric_gaps_strengthen_the_stall():
    inp = sim_input("data_pipeline_stall")
    alone = run("data_pipeline_stall", inp)
    inp.artifacts = (ArtifactAnalysis("pyspy_raw", {"classes_pct": {}, "input_pipeline_pct": 50.0}),)
    both = run("data_pipeline_stall", inp)
    assert both.confidence > alone.confidence and "py-spy" in both.sources


# --------------------------------------------------------------------------------------- engine


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_findings_dollars_never_exceed_the_jobs_waste(scenario):
    for noise, missing in ((0.02, 0.0), (0.1, 0.2)):
        inp = sim_input(scenario, noise=noise, missing=missing, gpus=12)
        findings = diagnose(inp)
        total = sum(f.waste_per_day_usd for f in findings)
        assert total <= inp.waste_per_day_usd + 1e-6
        assert all(f.waste_per_day_usd >= 0 for f in findings)
        # Specific causes most $/day first; the unexplained remainder, when kept, comes last whatever its $.
        causes = [f.waste_per_day_usd for f in findings if f.code != "unexplained_waste"]
        assert causes == sorted(causes, reverse=True)
        assert all(f.code != "unexplained_waste" for f in findings[:-1])


def _finding(code: str, impact: float, severity: Severity = Severity.WARNING) -> Finding:
    return Finding(code, severity, 0.8, code, "fix", impact=impact)


def test_apportion_scales_overlapping_causes_and_gives_symptoms_the_rest():
    rng = np.random.default_rng(0)
    for _ in range(200):
        fs = [_finding(c, float(rng.uniform(0, 1))) for c in rng.choice(CODES, size=4, replace=False)]
        cost, loss = 1000.0, float(rng.uniform(0, 1))
        E.apportion(fs, cost, cost * loss)
        assert sum(f.waste_per_day_usd for f in fs) <= cost * loss + 1e-9
    causes = [_finding("data_pipeline_stall", 0.2), _finding("throttling", 0.1)]
    symptom = _finding("baseline_regression", 0.5)
    E.apportion([*causes, symptom], 1000.0, 500.0)
    assert causes[0].waste_per_day_usd == pytest.approx(200.0) and causes[
        1
    ].waste_per_day_usd == pytest.approx(100.0)
    assert symptom.waste_per_day_usd == pytest.approx(200.0) and symptom.waste_share == pytest.approx(0.4)
    over = [_finding("data_pipeline_stall", 0.6), _finding("throttling", 0.6)]
    E.apportion(over, 1000.0, 300.0)
    assert [f.waste_per_day_usd for f in over] == pytest.approx([150.0, 150.0])


def test_no_waste_figure_means_impact_unknown_not_zero_dollars():
    fs = [_finding("throttling", 0.3)]
    E.apportion(fs, 1000.0, None)
    assert fs[0].waste_per_day_usd is None and fs[0].waste_share is None
    E.apportion(fs, None, 100.0)
    assert fs[0].waste_per_day_usd is None


def test_idle_gpus_keeps_its_dollars_when_mfu_is_unknown():
    # Idle GPU-hours × price need no MFU: with the job's waste unknown, idle_gpus carries the job's idle
    # waste ($72/day here) and every other cause is "impact unknown".
    fs = [_finding("idle_gpus", 0.3), _finding("throttling", 0.2)]
    E.apportion(fs, 240.0, None, 72.0)
    assert fs[0].waste_per_day_usd == 72.0
    assert fs[1].waste_per_day_usd is None


def test_a_job_at_its_reference_gives_known_zero_dollars():
    fs = [_finding("throttling", 0.3)]
    E.apportion(fs, 1000.0, 0.0)
    assert fs[0].waste_per_day_usd == 0.0 and fs[0].waste_share == 0.0


def test_a_symptom_explained_by_a_cause_becomes_context():
    found = {f.code: f for f in diagnose(sim_input("launch_overhead"))}
    assert found["launch_overhead"].severity.rank >= 1
    fs = found["false_saturation"]
    assert fs.severity is Severity.INFO and "explained by launch_overhead" in fs.title
    assert found["launch_overhead"].waste_per_day_usd > fs.waste_per_day_usd


def test_a_failing_rule_is_skipped(monkeypatch, caplog):
    def boom(inp: DiagnosisInput, f: Features) -> Finding | None:
        raise RuntimeError("bug")

    monkeypatch.setitem(RULES, "throttling", boom)
    found = diagnose(sim_input("memory_bound"))
    assert [f.code for f in found] == ["memory_bound"]
    assert "throttling failed" in caplog.text


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_degenerate_data_never_breaks_a_rule(scenario):
    one_gpu_two_samples = input_from_sim(simulate(SimSpec(scenario=scenario, gpus=1, duration_s=60)))
    blank = input_from_sim(simulate(SimSpec(scenario=scenario, gpus=2, duration_s=600)))
    for series in blank.signals.signals.values():
        for values in series.stats.values():
            values[:] = np.nan
        if series.per_gpu is not None:
            series.per_gpu[:] = np.nan
    mostly_lost = sim_input(scenario, missing=0.9)
    for inp in (one_gpu_two_samples, blank, mostly_lost):
        for code in CODES:
            run(code, inp)  # rules are called directly: the engine would hide an exception
    # No sample at all, yet the job wastes money (its MFU is known): never silent about it.
    found = diagnose(blank)
    if blank.waste_per_day_usd < blank.material_waste_usd_per_day:  # healthy scenarios meet their reference
        assert found == []
        return
    assert [f.code for f in found] == ["unexplained_waste"]
    assert found[0].waste_per_day_usd == pytest.approx(blank.waste_per_day_usd)
    assert {"gpu_util", "sm_active", "tensor_active"} <= set(found[0].missing_signals)


def test_no_signals_and_no_artifacts_means_no_findings():
    assert diagnose(DiagnosisInput(signals=None, gpu_count=8)) == []


def test_findings_serialise_with_units_and_windows():
    f = diagnose(sim_input("idle_gpus"))[0].as_dict()
    assert f["code"] == "idle_gpus" and f["window_start"] < f["window_end"]
    assert all({"label", "value", "unit"} == set(e) for e in f["evidence"])
    assert 0 < f["confidence"] <= 1 and f["waste_per_day_usd"] >= 0


# ------------------------------------------------------------------------------- real samples


@pytest.mark.shared
def test_real_traces_alexnet_syncs_and_copies_h100_nccl():
    from jobs.profiling.kineto import parse_kineto
    from jobs.profiling.nsys import parse_nsys
    from jobs.profiling.trace_analysis import analyze_trace
    from tests.conftest import sample_path

    alexnet = analyze_trace(parse_kineto(sample_path("kineto/hta_alexnet_a100.json.gz")))
    found = {f.code: f for f in diagnose(art_input(ArtifactAnalysis("kineto", alexnet, "alexnet")))}
    assert {"host_sync", "host_device_copy"} <= set(found)
    assert "pageable" in found["host_device_copy"].recommendation
    h100 = analyze_trace(parse_nsys(sample_path("nsys/nsysai_h100_2gpu_train_300ms.sqlite")))
    found = {f.code: f for f in diagnose(art_input(ArtifactAnalysis("nsys_sqlite", h100, "h100")))}
    assert "communication_wait" in found and found["communication_wait"].severity.rank >= 1
    assert any("exposed communication" in e.label for e in found["communication_wait"].evidence)


@pytest.mark.shared
def test_real_pyspy_profile_of_a_tokenizer_points_at_the_input_pipeline():
    from jobs.profiling.pyspy import analyze_pyspy
    from tests.conftest import sample_path

    py = analyze_pyspy(sample_path("pyspy/pyspy_bpe_tokenizer.speedscope.json"))
    f = run("data_pipeline_stall", art_input(ArtifactAnalysis("pyspy_speedscope", py, "bpe")))
    assert f is not None and "py-spy" in f.sources
    assert any("bpe" in e.label for e in f.evidence)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_per_gpu_rows_outside_per_gpu_keys_change_no_finding(scenario):
    """The diagnosis loads per-GPU rows of PER_GPU_KEYS only (jobs.pipeline.findings): the findings of a
    job with every per-GPU row equal those without the others."""
    from jobs.diagnosis.features import PER_GPU_KEYS

    full = sim_input(scenario, gpus=16)
    assert full.signals is not None
    narrow = copy.deepcopy(full)
    assert narrow.signals is not None
    dropped = 0
    for key, series in narrow.signals.signals.items():
        if key not in PER_GPU_KEYS and series.per_gpu is not None:
            series.per_gpu, series.gpu_timestamps, series.gpus = None, None, ()
            dropped += 1
    assert dropped >= 5  # fb_free, mem_clock, energy, NVLink bytes ... were there to drop

    def seen(inp: DiagnosisInput) -> list[tuple[Any, ...]]:
        return [(f.code, f.severity, f.confidence, f.title, f.windows, f.evidence) for f in diagnose(inp)]

    assert seen(narrow) == seen(full)


def test_features_refuse_per_gpu_rows_of_a_signal_the_diagnosis_does_not_load():
    f = Features(sim_input("healthy"))
    assert f.gpu_data(("sm_active",)) is not None
    with pytest.raises(ValueError, match="PER_GPU_KEYS"):
        f.gpu_data(("mem_clock",))
