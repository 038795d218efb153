"""Issue #24 follow-ups: the step breakdown of the steady state, and the GPU waiting for host CPU work.

1. ``step_breakdown`` (the TensorBoard plugin's step time by role) measures the same window as the rest
   of the analysis: ProfilerStep ranges when present, else the GPU's steady state from the first kernel
   to the last GPU activity. The plugin's own host-extent step (start-up included) stays under
   ``host_extent``.
2. When the GPU idles in long gaps whose next kernel is launched late while the launching thread runs
   CPU operators, the analysis says so (``gpu_idle_attribution.host_work``) and data_pipeline_stall
   concludes "the GPU waits for the host's CPU work", with the share of the window and the operators.

Traces are the issue's rebuilt trace (tests/unit/test_trace_windows.py) and small variants of it, built
from the documented Kineto format, plus real traces from ../shared/samples (skipped when absent).
"""

from __future__ import annotations

import numpy as np
import pytest

from jobs.profiling.events import OpKind
from jobs.profiling.kineto import parse_kineto
from jobs.profiling.nsys import parse_nsys
from jobs.profiling.trace_analysis import analyze_trace
from tests.conftest import sample_path as sample_or_skip
from tests.unit.test_trace_windows import mlp_without_profiler_steps

# ------------------------------------------------------------------ 1. step_breakdown, steady state


def test_issue_trace_step_breakdown_measures_the_steady_state_not_the_start_up() -> None:
    # By hand (the trace's layout is in test_trace_windows.mlp_without_profiler_steps): the steady state
    # is [890.3 ms, 1790.3 ms), 900 ms. In it, by the plugin's role priority:
    #   kernel    10 iterations x 33.12 ms                                    = 331.2 ms  = 36.8 %
    #   runtime   9 first launches of an iteration, 4 us each in an idle gap  = 0.036 ms  = 0.004 %
    #             (the first iteration's launch, at 890.29 ms, is before the window)
    #   cpu_exec  9 aten::copy_ of 62.9 ms + 9 x 11 us of aten::linear before the kernel (15 us minus
    #             its 4 us launch)                                            = 566.199 ms = 62.911 %
    #   other     9 x (100 + 185) us of the gaps no event covers              = 2.565 ms  = 0.285 %
    # The host-extent step (the plugin's, 1790.3 ms) adds the start-up: its two cudaFree (850 ms) made
    # runtime 47.48 % of the "step".
    rank = analyze_trace(parse_kineto(mlp_without_profiler_steps()))["ranks"][0]
    sb = rank["step_breakdown"]
    assert sb["basis"] == "gpu_span"
    assert sb["steps"] == 1
    assert sb["step_ms_mean"] == pytest.approx(900.0) == sb["window_ms"]
    assert sb["kernel_pct"] == pytest.approx(36.8)
    assert sb["runtime_pct"] == pytest.approx(0.004)
    assert sb["cpu_exec_pct"] == pytest.approx(62.911)
    assert sb["other_pct"] == pytest.approx(0.285)
    assert sb["per_step"][0]["duration_ms"] == pytest.approx(900.0)
    host = sb["host_extent"]
    assert host["basis"] == "cpu_ops"
    assert host["step_ms_mean"] == pytest.approx(1790.3)
    # runtime: the two cudaFree and all 10 first launches of an iteration (4 us each)
    assert host["runtime_pct"] == pytest.approx(100 * (850.0 + 10 * 0.004) / 1790.3, abs=1e-4)


def test_profiler_step_traces_keep_the_plugins_step_breakdown() -> None:
    # The TensorBoard plugin's own sample has ProfilerStep#N: its breakdown is the plugin's, unchanged,
    # with the basis stated and no host_extent copy.
    from jobs.profiling import tb_metrics

    trace = parse_kineto(sample_or_skip("kineto/tbplugin_gpu_metrics_input.json"))
    rank = analyze_trace(trace)["ranks"][0]
    sb = rank["step_breakdown"]
    assert sb["basis"] == "ProfilerStep"
    assert "host_extent" not in sb
    plugin = tb_metrics.step_breakdown(trace, trace.ranks[0], tb_metrics.tb_steps(trace, trace.ranks[0]))
    assert {k: v for k, v in sb.items() if k not in ("basis", "window_ms")} == plugin
    assert sb["window_ms"] == pytest.approx(13.41)


def _merged_ms(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length of the union of intervals, by a plain sort-and-merge (ns in, ms out)."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(zip(starts.tolist(), ends.tolist(), strict=True)):
        if cur_e is None or s > cur_e:
            total += 0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    total += 0 if cur_e is None else cur_e - cur_s
    return total / 1e6


def test_alexnet_sample_step_breakdown_leaves_the_weight_copies_to_start_up() -> None:
    # hta_alexnet_a100 (no ProfilerStep). By hand from the file (see test_trace_windows): the steady
    # state runs from the first kernel, 30 509.352 ms after the first host event, for 12 840.244 ms;
    # the host extent is 43 348.556 ms. The 16 pageable HtoD weight copies all run before the first
    # kernel: the plugin's step counts them (memcpy 0.128 %), the steady state has no copy at all. Every
    # kernel lies inside the steady state, so its kernel role is the union of all (non-NCCL) kernels,
    # merged here independently of the analysis.
    trace = parse_kineto(sample_or_skip("kineto/hta_alexnet_a100.json.gz"))
    rank = analyze_trace(trace)["ranks"][0]
    sb = rank["step_breakdown"]
    assert sb["basis"] == "gpu_span"
    assert sb["step_ms_mean"] == pytest.approx(12_840.244) == rank["gpu_idle_attribution"]["window_ms"]
    assert sb["host_extent"]["step_ms_mean"] == pytest.approx(43_348.556)
    assert sb["host_extent"]["memcpy_pct"] > 0.1
    assert sb["memcpy_pct"] == 0.0
    gpu = trace.ranks[0].gpu
    first_kernel = int(gpu.start_ns[gpu.kind == OpKind.KERNEL].min())
    copies = gpu.kind == OpKind.MEMCPY
    assert copies.sum() == 16 and int(gpu.end_ns[copies].max()) <= first_kernel
    k = gpu.kind == OpKind.KERNEL
    kernel_ms = _merged_ms(gpu.start_ns[k], gpu.end_ns[k])
    assert sb["kernel_pct"] == pytest.approx(100 * kernel_ms / 12_840.244, abs=1e-3)
    roles = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other")
    assert sum(sb[f"{r}_pct"] for r in roles) == pytest.approx(100.0, abs=1e-3)


def test_nsys_sample_step_breakdown_is_each_gpus_steady_state() -> None:
    # nsysai_h100_2gpu_train_300ms: by hand (see test_trace_windows) GPU 0's steady state runs
    # 60 111 541 307 -> 60 411 390 119 ns (299.848812 ms), GPU 1's 60 111 513 113 -> 60 410 174 664 ns
    # (298.661551 ms).
    analysis = analyze_trace(parse_nsys(sample_or_skip("nsys/nsysai_h100_2gpu_train_300ms.sqlite")))
    windows = sorted(r["step_breakdown"]["window_ms"] for r in analysis["ranks"])
    assert windows == [pytest.approx(298.661551), pytest.approx(299.848812)]
    for r in analysis["ranks"]:
        assert r["step_breakdown"]["basis"] == "gpu_span"
        assert r["step_breakdown"]["step_ms_mean"] == r["step_breakdown"]["window_ms"]
