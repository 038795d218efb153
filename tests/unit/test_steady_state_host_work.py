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

import json
from pathlib import Path

import numpy as np
import pytest

from jobs.diagnosis.base import Severity
from jobs.profiling.events import OpKind
from jobs.profiling.kineto import parse_kineto
from jobs.profiling.nsys import parse_nsys
from jobs.profiling.trace_analysis import analyze_trace
from tests.conftest import sample_path as sample_or_skip
from tests.unit.test_trace_misreads import BASE_NS, BF16_GEMM, ELEMENTWISE, STEP, TraceBuilder, run
from tests.unit.test_trace_windows import BUSY_US, GAP_US, ITERATIONS, STARTUP_US, mlp_without_profiler_steps

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


# ------------------------------------------------------------------ 2. the GPU waits for host CPU work

PERIOD_US = BUSY_US + GAP_US


def between_kernels(host: str, n: int = ITERATIONS, gap_in: set[int] | None = None) -> bytes:
    """The issue trace's steady state (no start-up): `n` iterations of 3 bf16 GEMMs (33.12 ms), with
    63.2 ms gaps after the iterations in `gap_in` (default: all but the last) and none elsewhere, and in
    each gap the host doing `host`:

    * ``cpu_op``: an ``aten::copy_`` of 62.9 ms (CPU work), then the next iteration's launch 10 us
      before its kernel -- the issue's trace;
    * ``sleep``: nothing traced (``time.sleep`` or Python outside operators), the same late launch;
    * ``dataloader``: the single-process DataLoader's ``__next__`` for 62.9 ms, the same late launch;
    * ``collective``: a host-side ``nccl:all_reduce`` for 62.9 ms (waiting for other ranks), the same
      late launch;
    * ``queued``: the same ``aten::copy_``, but the next iteration's kernels were all launched right after
      the previous iteration's launches (nothing waits for the host: the GPU idles for another reason).
    """
    gap_in = set(range(n - 1)) if gap_in is None else gap_in
    b = TraceBuilder()
    kernel_us = BUSY_US / 3
    t = 0.0
    prev_launch = -100.0
    for i in range(n):
        b.cpu("aten::linear", t - 15.0, 60.0)
        for j in range(3):
            if host == "queued" and i:
                launch = prev_launch + 10.0 * (j + 1)
            else:
                launch = t - 10.0 if j == 0 else t + 20.0 * j
            b.launch(BF16_GEMM, launch, t + j * kernel_us, kernel_us)
        prev_launch = t + 40.0
        end = t + BUSY_US
        if i in gap_in and i + 1 < n:
            if host == "cpu_op" or host == "queued":
                b.cpu("aten::copy_", end + 100.0, GAP_US - 300.0)
            elif host == "collective":
                b.cpu("nccl:all_reduce", end + 100.0, GAP_US - 300.0)
            elif host == "dataloader":
                b.cpu(
                    "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", end + 100.0, GAP_US - 300.0
                )
            t = end + GAP_US
        else:
            t = end
    return _kineto_document(b, t)


def _kineto_document(b: TraceBuilder, end_us: float) -> bytes:
    window = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": 1}
    return json.dumps(
        {
            "schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "numSms": 108}],
            "baseTimeNanoseconds": BASE_NS,
            "traceEvents": [*b.events, {**window, "ts": -100.0, "dur": end_us + 200.0}],
        }
    ).encode()


def test_issue_trace_host_work_names_the_cpu_operators_between_kernels() -> None:
    # By hand: 9 gaps of 63.2 ms (568.8 ms = 63.2 % of 900 ms), each ended by the next iteration's first
    # GEMM, launched 10 us before it ran -- 63.2 ms after the gap began: all late. In each gap the only
    # launching thread is in aten::copy_ for 62.9 ms and in aten::linear for 11 us before its launch
    # (15 us minus the 4 us cudaLaunchKernel, which is runtime): 9 x 62.911 ms = 566.199 ms = 62.911 %.
    # The launch itself is 9 x 4 us = 0.004 %; nothing traced: 9 x (100 + 185) us = 0.285 %.
    rank = analyze_trace(parse_kineto(mlp_without_profiler_steps()))["ranks"][0]
    ga = rank["gpu_idle_attribution"]
    assert ga["other_pct"] == pytest.approx(63.2)
    hw = ga["host_work"]
    assert hw["launching_threads"] == 1
    assert hw["late_launch_pct"] == pytest.approx(63.2)
    assert hw["queued_pct"] == 0.0
    assert hw["cpu_ops_pct"] == pytest.approx(62.911)
    assert hw["runtime_pct"] == pytest.approx(0.004)
    assert hw["untraced_pct"] == pytest.approx(0.285)
    assert hw["communication_pct"] == 0.0
    assert hw["cpu_ops_gaps"] == 9
    assert hw["cpu_ops_largest_gap_pct"] == pytest.approx(100 / 9, abs=1e-3)
    assert [(o["name"], o["count"], o["idle_ms"]) for o in hw["top_ops"]] == [
        ("aten::copy_", 9, pytest.approx(566.1)),
        ("aten::linear", 9, pytest.approx(0.099)),
    ]
    assert [(o["name"], o["count"]) for o in hw["top_runtime"]] == [("cudaLaunchKernel", 9)]


def test_issue_trace_concludes_the_gpu_waits_for_host_cpu_work() -> None:
    # The rule that owns the cause is data_pipeline_stall's host-work reading: long gaps, late launches,
    # the launching thread in CPU operators -- not launch_overhead (no gap under 1 ms), not host_sync
    # (nothing blocks in the steady state; the start-up cudaFree are in phases).
    _, found = run(mlp_without_profiler_steps())
    assert set(found) == {"data_pipeline_stall"}
    f = found["data_pipeline_stall"]
    assert f.severity is Severity.WARNING
    assert f.impact == pytest.approx(0.62911)
    assert f.title.startswith("In the captured trace window the GPU waits for the host: CPU work between")
    assert "aten::copy_" in f.title and "63 %" in f.title
    assert f.recommendation.startswith("The GPU waits for the host")
    assert "DataLoader num_workers" not in f.recommendation  # the DataLoader advice is for input stalls
    values = {e.label.split(": ", 1)[1]: e.value for e in f.evidence}
    assert values["GPU idle with nothing queued while the launching threads run CPU operators"] == 62.91
    assert values["GPU idle"] == 63.2
    assert values["host in aten::copy_ (9 calls) while the GPU waits"] == pytest.approx(62.9)
    start = BASE_NS / 1e9 + STARTUP_US / 1e6
    assert f.windows == [(pytest.approx(start), pytest.approx(start + 0.9))]  # never the start-up


def test_host_work_needs_late_launches_and_cpu_operators() -> None:
    # The same idle (9 x 63.2 ms = 63.2 % of 900 ms) with three other host sides:
    rank, found = run(between_kernels("cpu_op"))
    assert rank["gpu_idle_attribution"]["host_work"]["cpu_ops_pct"] == pytest.approx(62.911)
    assert found["data_pipeline_stall"].title.startswith("In the captured trace window the GPU waits for")
    # nothing traced on the host (a sleep): the GPU still waited for a launch, but on what the trace
    # cannot say -- reported as untraced, no finding.
    rank, found = run(between_kernels("sleep"))
    hw = rank["gpu_idle_attribution"]["host_work"]
    assert hw["late_launch_pct"] == pytest.approx(63.2)
    # all of each gap but the 15 us of aten::linear and its launch before the next kernel
    assert hw["untraced_pct"] == pytest.approx(100 * 9 * (63.2 - 0.015) / 900)
    assert hw["cpu_ops_pct"] < 0.02
    assert "data_pipeline_stall" not in found
    # the DataLoader: input, as before (DataLoader title and advice), not host work.
    rank, found = run(between_kernels("dataloader"))
    assert rank["gpu_idle_attribution"]["input_pct"] == pytest.approx(100 * 9 * 62.9 / 900)
    assert rank["gpu_idle_attribution"]["host_work"]["cpu_ops_pct"] < 0.02
    assert found["data_pipeline_stall"].title.endswith("waiting for the DataLoader")
    # a host-side collective: the host waits for other ranks, counted apart, not host CPU work.
    rank, found = run(between_kernels("collective"))
    hw = rank["gpu_idle_attribution"]["host_work"]
    assert hw["communication_pct"] == pytest.approx(62.9)
    assert hw["cpu_ops_pct"] < 0.02
    assert "data_pipeline_stall" not in found
    # the next kernels queued before each gap began: the GPU did not wait for the host.
    rank, found = run(between_kernels("queued"))
    hw = rank["gpu_idle_attribution"]["host_work"]
    assert hw["queued_pct"] == pytest.approx(63.2) and hw["late_launch_pct"] == 0.0
    assert "data_pipeline_stall" not in found


def test_one_long_cpu_gap_is_a_one_off_not_a_warning() -> None:
    # 10 iterations back to back (331.2 ms of GEMMs) with one 63.2 ms gap of aten::copy_ after the 5th:
    # window 394.4 ms, host work 62.911 / 394.4 = 15.95 % in a single gap -> info, one-off title, and
    # no recurring impact.
    rank, found = run(between_kernels("cpu_op", gap_in={4}))
    hw = rank["gpu_idle_attribution"]["host_work"]
    assert rank["gpu_idle_attribution"]["window_ms"] == pytest.approx(394.4)
    assert hw["cpu_ops_pct"] == pytest.approx(100 * 62.911 / 394.4, abs=1e-3)
    assert hw["cpu_ops_gaps"] == 1 and hw["cpu_ops_largest_gap_pct"] == 100.0
    f = found["data_pipeline_stall"]
    assert f.severity is Severity.INFO
    assert "once, not in a repeating pattern" in f.title
    assert f.impact == 0.0


def test_host_work_in_every_profiled_step_is_a_warning() -> None:
    # 4 ProfilerSteps of 100 ms: 40 kernels of 1 ms from 10 ms on; after the 20th a 30 ms aten::copy_ on
    # the host, the 21st kernel launched when it returns: 30 ms of late-launch idle with the host in a
    # CPU operator in each step = 30 % of it (the 10 ms before the first kernel is idle too, but its
    # kernel is launched at 10 ms - 5 us: the host is in no operator there, so it is untraced).
    b = TraceBuilder()
    b.steps(4)
    for k in range(4):
        t = k * STEP + 10_000.0
        for i in range(40):
            if i == 20:
                b.cpu("aten::copy_", t, 30_000.0)
                t += 30_000.0
            b.launch(ELEMENTWISE, t - 5.0, t, 1_000.0)
            t += 1_000.0
    rank, found = run(b.document(4))
    hw = rank["gpu_idle_attribution"]["host_work"]
    assert hw["cpu_ops_steps"] == 4
    assert hw["cpu_ops_step_pcts"] == [pytest.approx(30.0, abs=0.01)] * 4
    f = found["data_pipeline_stall"]
    assert f.severity is Severity.WARNING
    assert any("in 4 of 4 steps" in e.label for e in f.evidence)


def test_alexnet_lazy_init_in_the_window_is_runtime_not_host_work() -> None:
    # hta_alexnet_a100: the long gaps of its first iterations are filled by CUDA runtime calls, not CPU
    # operators (by hand from the file: cudaStreamCreateWithFlags 734.9 ms in the first gap, the first
    # cudaLaunchKernel of cuDNN's kernels 3 055.6 ms -- lazy module loading --, cudaMalloc 824.4 ms and
    # 1 041.6 ms as the caching allocator grows): runtime, at most 4.4 % in CPU operators (aten::conv2d
    # outside its runtime calls) -> no host-work finding (the sample's findings stay host_sync and
    # host_device_copy, test_real_samples_diagnosis).
    rank = analyze_trace(parse_kineto(sample_or_skip("kineto/hta_alexnet_a100.json.gz")))["ranks"][0]
    hw = rank["gpu_idle_attribution"]["host_work"]
    assert hw["runtime_pct"] > 40.0
    names = {o["name"] for o in hw["top_runtime"]}
    assert {"cudaLaunchKernel", "cudaMalloc", "cudaStreamCreateWithFlags"} <= names
    assert hw["cpu_ops_pct"] < 10.0


def test_ddp_sample_host_work_repeats_in_every_step() -> None:
    # hta_a100_nccl_allreduce rank 0 (3 ProfilerSteps): the main thread's aten::unflatten_dense_tensors
    # (15.5 + 7.6 ms per step), aten::flatten_dense_tensors and the optimizer's _foreach_mul_/_foreach_add_
    # run while the GPU has nothing queued (see test_real_samples_diagnosis' comment, by hand per gap).
    rank = analyze_trace(parse_kineto(sample_or_skip("kineto/hta_a100_nccl_allreduce_rank0.json.gz")))[
        "ranks"
    ][0]
    hw = rank["gpu_idle_attribution"]["host_work"]
    assert hw["cpu_ops_pct"] == pytest.approx(19.67, abs=0.01)
    assert hw["cpu_ops_steps"] == 3 and hw["cpu_ops_gaps"] == 28
    assert hw["top_ops"][0]["name"] == "aten::unflatten_dense_tensors"
    assert hw["top_ops"][0]["count"] == 6


def test_launches_the_trace_cannot_match_are_not_called_late() -> None:
    # Kernels carry correlation ids but the runtime calls do not (a trimmed or foreign trace): no gap can
    # be shown to end with a late (or queued) launch, so its idle is "unknown", never host work -- and
    # nothing raises.
    b = TraceBuilder()
    for i in range(12):
        b.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": i * 10_000.0 - 10.0,
                "dur": 4.0,
                "args": {},
            }
        )
        b.gpu("kernel", BF16_GEMM, i * 10_000.0, 1_000.0, 1_000 + i)
        b.cpu("aten::copy_", i * 10_000.0 + 1_100.0, 8_800.0)
    rank, found = run(_kineto_document(b, 120_000.0))
    hw = rank["gpu_idle_attribution"]["host_work"]
    assert hw["late_launch_pct"] == 0.0
    assert hw["queued_pct"] == 0.0
    assert hw["unknown_pct"] == pytest.approx(rank["gpu_idle_attribution"]["other_pct"])
    assert hw["unknown_pct"] > 80
    assert "data_pipeline_stall" not in found


def test_real_excerpt_with_profiler_step_keeps_the_plugin_breakdown_and_untraced_host_time() -> None:
    # tests/data/real/kineto/hta_backward_thread_a100.json (HTA's test excerpt of a real A100 trace), by
    # hand from its 7 events: ProfilerStep#552 at ts 1666149715033200 us for 413 451 us; on the autograd
    # thread (tid 24922) evaluate_function: AddmmBackward0 [..364322, +145 us) holding cudaLaunchKernel
    # [..364374, +10 us), whose cutlass tensor-op GEMM runs [..428509, +45 us). Step breakdown: the
    # plugin's, kernel 45 / 413 451 = 0.0109 %. GPU idle: [..033200, ..428509) = 395 309 us ended by the
    # GEMM launched 331 174 us after the gap began (late), then [..428554, ..446651) = 18 097 us that no op
    # ends (unknown). In the late gap the launching thread is in the operator 135 us, in the launch 10 us,
    # and in nothing traced 395 164 us: an excerpt, the host's time is untraced -- no host-work claim.
    path = Path(__file__).resolve().parents[1] / "data" / "real" / "kineto" / "hta_backward_thread_a100.json"
    rank = analyze_trace(parse_kineto(path))["ranks"][0]
    sb = rank["step_breakdown"]
    assert sb["basis"] == "ProfilerStep" and "host_extent" not in sb
    assert sb["window_ms"] == pytest.approx(413.451)
    assert sb["kernel_pct"] == pytest.approx(100 * 45 / 413_451, abs=1e-4)
    hw = rank["gpu_idle_attribution"]["host_work"]
    assert hw["late_launch_ms"] == pytest.approx(395.309)
    assert hw["unknown_ms"] == pytest.approx(18.097)
    assert hw["queued_ms"] == 0.0
    assert hw["cpu_ops_ms"] == pytest.approx(0.135)
    assert hw["runtime_ms"] == pytest.approx(0.010)
    assert hw["untraced_ms"] == pytest.approx(395.164)
    assert [o["name"] for o in hw["top_ops"]] == ["autograd::engine::evaluate_function: AddmmBackward0"]
