"""The typed views of stored artifact analyses (jobs.profiling.schema): lenient, field by field."""

from __future__ import annotations

import math

from jobs.profiling.schema.blocks import Capture, TensorCores, decode_capture
from jobs.profiling.schema.common import declared_paths, lenient
from jobs.profiling.schema.monitoring import MonitoringAnalysis, decode_monitoring
from jobs.profiling.schema.pyspy import Icicle, PySpyAnalysis, decode_pyspy
from jobs.profiling.schema.summaries import NcuAnalysis, NsysStatsAnalysis, decode_ncu, decode_nsys_stats
from jobs.profiling.schema.trace import TemporalBreakdown, decode_trace


def test_a_trace_rank_reads_its_blocks_and_ignores_unknown_keys() -> None:
    stored = {
        "source": "kineto",
        "unknown_top_level": {"x": 1},
        "capture": {"start_unix": 1716423322.5, "end_unix": 1716423323, "ranks": [0], "gpu_names": ["A100"]},
        "ranks": [
            {
                "rank": 3,
                "temporal_breakdown": {"idle_pct": 77.7, "span_ms": 435, "new_key": "ignored"},
                "kernel_breakdown": {"kernel_count": 1800, "tiny_kernels": {"count_pct": 42.9}},
                "gpu_idle_attribution": {
                    "has_gpu_ops": True,
                    "idle_gaps": [{"lower_us": 30, "upper_us": 1000, "count": 2353}],
                    "host_work": {"cpu_ops_pct": 19.7, "top_ops": [{"name": "aten::mul", "count": 6}]},
                },
                "host_blocking": {"step_pct": 0.01, "sites": [{"site": "cudaEventSynchronize"}]},
            }
        ],
    }
    trace = decode_trace(stored)
    rank = trace.ranks[0]
    assert rank.rank == 3
    assert rank.temporal_breakdown.idle_pct == 77.7
    assert rank.temporal_breakdown.span_ms == 435.0 and isinstance(rank.temporal_breakdown.span_ms, float)
    assert rank.kernel_breakdown.tiny_kernels.count_pct == 42.9
    assert rank.attributed
    assert rank.gpu_idle_attribution.idle_gaps[0].upper_us == 1000.0
    assert rank.gpu_idle_attribution.host_work.top_ops[0].name == "aten::mul"
    assert rank.host_blocking is not None and rank.host_blocking.sites[0].site == "cudaEventSynchronize"
    assert trace.capture is not None and trace.capture.window == (1716423322.5, 1716423323.0)


def test_an_older_rank_without_blocks_reads_as_empty_blocks_of_none() -> None:
    rank = decode_trace({"ranks": [{"rank": 0}]}).ranks[0]
    assert rank.temporal_breakdown.idle_pct is None
    assert rank.gpu_idle_attribution.host_work.cpu_ops_pct is None
    assert rank.gpu_idle_attribution.idle_gaps == []
    assert not rank.attributed
    # host_blocking's presence is evidence (the blocking analysis ran), so its absence stays visible.
    assert rank.host_blocking is None


def test_values_of_the_wrong_type_read_as_absent_and_bad_list_entries_are_dropped() -> None:
    rank = decode_trace(
        {
            "ranks": [
                "not a rank",
                {
                    "rank": "three",
                    "temporal_breakdown": {"idle_pct": "77", "compute_pct": True, "span_ms": math.nan},
                    "memcpy": {"by_kind": [{"copy_kind": "HtoD", "time_ms": 1.5}, 7, {"copy_kind": 5}]},
                    "tensor_cores": "broken",
                    "gpu_idle_attribution": {"has_gpu_ops": "yes"},
                },
            ]
        }
    ).ranks
    assert len(rank) == 1
    r = rank[0]
    assert r.rank is None
    assert (
        r.temporal_breakdown.idle_pct,
        r.temporal_breakdown.compute_pct,
        r.temporal_breakdown.span_ms,
    ) == (
        None,
        None,
        None,
    )
    # The entry whose copy_kind is a number keeps its other fields; the non-mapping entry is dropped.
    assert [(k.copy_kind, k.time_ms) for k in r.memcpy.by_kind] == [("HtoD", 1.5), (None, None)]
    assert r.tensor_cores == TensorCores()
    assert not r.attributed


def test_a_payload_that_is_not_a_mapping_decodes_to_the_empty_analysis() -> None:
    assert decode_trace(None).ranks == []
    assert decode_trace([1, 2]).ranks == []
    assert decode_pyspy("x").classes_pct is None
    assert decode_capture({"capture": "x"}) is None
    assert decode_capture(None) is None


def test_ncu_nsys_pyspy_and_monitoring_blocks() -> None:
    ncu = decode_ncu(
        {"format": "ncu_csv", "bound_time_share_pct": {"memory": 61.0, "compute": "n/a"}, "tensor_cores": {}}
    )
    assert ncu.format == "ncu_csv" and ncu.bound_time_share_pct == {"memory": 61.0}
    nsys = decode_nsys_stats(
        {"format": "nsys_stats_csv", "memory_ops": {"by_operation": [{"operation": "[CUDA memcpy HtoD]"}]}}
    )
    assert (
        nsys.memory_ops.by_operation[0].operation == "[CUDA memcpy HtoD]"
        and nsys.kernels.total_time_ms is None
    )
    py = decode_pyspy({"classes_pct": {"input": 37.0}, "hot_inclusive": [{"label": "f", "class": "input"}]})
    assert py.classes_pct == {"input": 37.0} and py.hot_inclusive[0].frame_class == "input"
    smi = decode_monitoring(
        {"format": "nvidia_smi_csv", "start_unix_s": 1.7e9, "gpus": [{"gpu_name": "H100"}]}
    )
    assert smi.gpus[0].gpu_name == "H100" and smi.end_unix_s is None


def test_a_capture_window_needs_both_ends_in_order() -> None:
    assert Capture(start_unix=2.0, end_unix=1.0).window is None
    assert Capture(start_unix=1.0).window is None
    assert Capture(start_unix=1.0, end_unix=1.0).window == (1.0, 1.0)


def test_profiler_facts_take_the_upper_median_of_the_ranks_that_have_them_and_skip_junk() -> None:
    from jobs.intake.artifacts import profiler_comm_share_pct, profiler_step_time_ms

    trace = decode_trace(
        {
            "ranks": [
                {"step_times": {"median_ms": 100}},
                {"step_times": {"median_ms": "n/a"}},
                "not a rank",  # raised AttributeError in the dict reader
                {"step_times": {"median_ms": 300}, "step_breakdown": {"communication_pct": 6.0}},
            ]
        }
    )
    assert profiler_step_time_ms(trace) == 300.0
    assert profiler_comm_share_pct(trace) == 6.0
    assert profiler_step_time_ms(decode_trace({"ranks": [{"step_times": {"median_ms": 0}}]})) is None


def test_the_trace_card_reads_an_older_or_junk_analysis_without_raising() -> None:
    from jobs.views.artifacts import ArtifactView, _trace

    view = ArtifactView(artifact=None)  # type: ignore[arg-type]
    _trace(
        view,
        {
            "summary": {"idle_pct_mean": 40.0, "host_wait_pct_mean": 50.0, "ranks_with_gpu_ops": "2"},
            "warnings": ["clock skew", 7],
            "ranks": [
                "not a rank",  # raised AttributeError in the dict reader
                {"rank": 1, "has_gpu_kernels": False, "kernel_breakdown": {"kernel_time_ms": 9e9}},
                {
                    "rank": 0,
                    "kernel_breakdown": {"kernel_time_ms": 5.0, "top_kernels": [{"name": "gemm"}, 3]},
                },
            ],
        },
    )
    facts = {label: value for label, value, _ in view.facts}
    # No attribution: HTA's span idle, and its host wait in the same unit (50 % of 40 % = 20 % of the span).
    assert facts["GPU idle"] == "40 %" and facts["Idle waiting for the host"] == "20 % of the span"
    assert "Ranks with GPU work" not in facts  # a string count is not shown as a number
    assert view.tables[0].title == "Top kernels by time (rank 0)" and view.tables[0].titles == ["gemm"]
    assert view.warnings == ["clock skew"]


def test_the_ncu_and_nsys_stats_cards_show_the_parsers_numbers() -> None:
    from pathlib import Path

    from jobs.profiling.ncu import analyze_ncu
    from jobs.profiling.nsys_stats import analyze_nsys_stats
    from jobs.views.artifacts import ArtifactView, _ncu, _nsys_stats

    data = Path(__file__).parent / "data"
    ncu = analyze_ncu(data / "ncu_details_2022.csv")
    view = ArtifactView(artifact=None)  # type: ignore[arg-type]
    _ncu(view, ncu)
    facts = {label: value for label, value, _ in view.facts}
    assert facts["Kernel launches"] == f"{ncu['kernel_launches']:,.0f}"
    assert view.tables[0].rows[0][0] == ncu["kernels"][0]["kernel"]
    assert len(view.tables[0].rows) == min(10, len(ncu["kernels"]))

    stats = analyze_nsys_stats(data / "nsys_stats_stdout_2024.txt")
    view = ArtifactView(artifact=None)  # type: ignore[arg-type]
    _nsys_stats(view, stats)
    facts = {label: value for label, value, _ in view.facts}
    assert facts["Kernel instances"] == f"{stats['kernels']['instances']:,.0f}"
    assert view.tables[0].rows[0][0] == stats["kernels"]["top"][0]["name"]


def _exists(obj: object, path: list[str]) -> bool:
    if not path:
        return True
    key, rest = path[0], path[1:]
    if key.endswith("[]"):
        items = obj.get(key[:-2]) if isinstance(obj, dict) else None
        return isinstance(items, list) and any(_exists(i, rest) for i in items)
    return isinstance(obj, dict) and key in obj and _exists(obj[key], rest)


def test_the_ncu_and_nsys_stats_schemas_name_keys_their_parsers_write() -> None:
    from pathlib import Path

    from jobs.profiling.ncu import analyze_ncu
    from jobs.profiling.nsys_stats import analyze_nsys_stats

    data = Path(__file__).parent / "data"
    ncus = [analyze_ncu(p) for p in sorted(data.glob("ncu_*.csv"))]
    stats = [analyze_nsys_stats(p) for p in sorted(data.glob("nsys_stats_*.txt"))]
    # Written only when SIMT kernels ran (none in these files) / measured by ncu only.
    absent_here = {"tensor_cores.top_simt_kernels[].name", "tensor_cores.top_simt_kernels[].count"}
    absent_here |= {"tensor_cores.top_simt_kernels[].time_ms"}
    for cls, analyses, also_absent in (
        (NcuAnalysis, ncus, set()),
        (NsysStatsAnalysis, stats, {"tensor_cores.tensor_pipe_active_pct"}),
    ):
        assert len(analyses) >= 2
        for path in declared_paths(cls):
            if path not in absent_here | also_absent:
                assert any(_exists(a, path.split(".")) for a in analyses), f"{cls.__name__}: {path}"


def test_the_pyspy_and_monitoring_schemas_name_keys_their_parsers_write() -> None:
    from pathlib import Path

    from jobs.profiling import monitoring, pyspy

    data = Path(__file__).parent / "data"
    profiles = [pyspy.analyze_pyspy(p, filename=p.name) for p in sorted(data.glob("pyspy_*.txt"))]
    logs = [monitoring.analyze_nvidia_smi(data / "nvidia_smi_units.csv")]
    logs += [monitoring.analyze_dstat(p) for p in sorted(data.glob("dstat_*.csv"))]
    for cls, analyses, absent_here in (
        # A capture names hosts only when the profile does.
        (PySpyAnalysis, profiles, {"capture.hosts"}),
        # `gpu_name` is the older parsers' key for a GPU's name.
        (MonitoringAnalysis, logs, {"gpus[].gpu_name"}),
    ):
        assert len(analyses) >= 2
        for path in declared_paths(cls):
            if path not in absent_here:
                assert any(_exists(a, path.split(".")) for a in analyses), f"{cls.__name__}: {path}"


def test_the_pyspy_and_monitoring_cards_show_the_parsers_numbers() -> None:
    from pathlib import Path

    from jobs.profiling import monitoring, pyspy
    from jobs.views.artifacts import ArtifactView, _monitoring, _pyspy

    data = Path(__file__).parent / "data"
    profile = pyspy.analyze_pyspy(data / "pyspy_train_plain.txt", filename="p.txt")
    view = ArtifactView(artifact=None)  # type: ignore[arg-type]
    _pyspy(view, profile)
    assert view.tables[0].rows[0][0] == profile["hot_self"][0]["label"]
    assert view.tables[0].titles[0] == profile["hot_self"][0]["file"]

    log = monitoring.analyze_dstat(data / "dstat_0.7.3.csv")
    view = ArtifactView(artifact=None)  # type: ignore[arg-type]
    _monitoring(view, log)
    facts = {label: value for label, value, _ in view.facts}
    assert facts["CPU idle (mean)"] == f"{log['summary']['cpu_idle_mean_pct']:,.1f} %"


def test_the_compare_pages_step_samples_skip_junk_ranks_and_steps() -> None:
    from jobs.outputs.compare_data import _step_samples
    from jobs.outputs.compare_traces import TraceFact

    analysis = {
        "ranks": [
            "not a rank",  # raised AttributeError in the dict reader
            {
                "step_times": {
                    "steps": [{"duration_ms": 222.4}, {"duration_ms": "x"}, 5, {"duration_ms": 219}]
                }
            },
            {"step_times": {"steps": [{"duration_ms": 230.0}]}},
        ]
    }
    newest = TraceFact(1, "kineto", "t.json", 0, "", decode_trace(analysis))
    older = TraceFact(
        2,
        "kineto",
        "u.json",
        0,
        "",
        decode_trace({"ranks": [{"step_times": {"steps": [{"duration_ms": 1.0}]}}]}),
    )
    assert _step_samples([newest, older]) == [222.4, 219.0, 230.0]
    assert _step_samples([]) == []


def test_the_fast_path_refuses_non_finite_numbers_and_bools_like_the_walk() -> None:
    for bad in (math.inf, -math.inf, math.nan, True):
        assert lenient({"idle_pct": bad, "span_ms": 2}, TemporalBreakdown) == TemporalBreakdown(span_ms=2.0)
    assert lenient({"kept_nodes": 3.0}, Icicle).kept_nodes is None  # a count is an integer
