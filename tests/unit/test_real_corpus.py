"""Real public profiling files kept in tests/data/real (issue 24 item 7), read through the service's own entry
points (`jobs.profiling.detect.detect_kind`, `jobs.intake.artifacts.analyze_file`) and the diagnosis, each
pinned
against the truth derived by hand from the file itself. Where the service is wrong and the fix belongs to
another area, the test is a strict xfail naming that area. Sources, licences and commits: MANIFEST.md there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.diagnosis import diagnose
from jobs.diagnosis.base import ArtifactAnalysis, DiagnosisInput
from jobs.intake.artifacts import analyze_file
from jobs.profiling.detect import detect_kind, read_head

REAL = Path(__file__).resolve().parents[1] / "data" / "real"


def parsed(relative: str) -> tuple[str, dict[str, Any]]:
    """(kind as detected, analysis) of one kept file, as an upload would be parsed."""
    path = REAL / relative
    kind = detect_kind(path.name, read_head(path))
    return kind, analyze_file(path, kind)


def codes(kind: str, analysis: dict[str, Any]) -> set[str]:
    art = ArtifactAnalysis(kind=kind, analysis=analysis, name="real")
    return {f.code for f in diagnose(DiagnosisInput(signals=None, gpu_count=8, artifacts=[art]))}


# --- HTA's backward-thread excerpt (facebookresearch/HolisticTraceAnalysis, MIT) ----------------------------
# By hand, from the 7 events: one ProfilerStep (#552, ts 1666149715033200 us, dur 413451 us), one "##
# backward ##" annotation, three CPU ops on the autograd thread (tid 24922), one cudaLaunchKernel (10 us)
# and exactly one GPU kernel: cutlass_80_tensorop_s1688gemm_128x128 (an A100 TF32 tensor-op GEMM, sm80), 45
# us on stream 7. distributedInfo: rank 0, no world size, no deviceProperties (the GPU model is not named).
# An excerpt cut for a call-stack test: one kernel says nothing about a training step, so no rule may fire
# (MIN_TRACE_KERNELS = 10).


def test_hta_backward_thread_excerpt_is_one_tensor_core_kernel_and_no_finding() -> None:
    kind, a = parsed("kineto/hta_backward_thread_a100.json")
    assert kind == "kineto"
    (rank,) = a["ranks"]
    assert rank["rank"] == 0
    assert rank["kernel_breakdown"]["kernel_count"] == 1
    assert rank["temporal_breakdown"]["span_ms"] == pytest.approx(0.045)
    assert rank["tensor_cores"]["tensor_core_time_pct"] == 100.0  # s1688 tensorop: tensor cores (TF32)
    assert rank["step_times"]["count"] == 1
    assert rank["step_times"]["median_ms"] == pytest.approx(413.451)
    cap = a["capture"]
    assert cap["ranks"] == [0] and cap["world_size"] is None and cap["gpu_names"] == []
    # Event extent on the epoch-microsecond clock: the step's start to its end.
    assert (cap["start_unix"], cap["end_unix"]) == (
        pytest.approx(1666149715.0332),
        pytest.approx(1666149715.446651),
    )
    assert codes(kind, a) == set()


# --- gpu_glasses' nvidia-smi log (xypp3/gpu_glasses, MIT) ---------------------------------------------------
# By hand: header "timestamp,gpu,index,memory.used,memory.total,power.draw,temperature.gpu"; 43 rows at six
# timestamps with their own zone (+08:00): 17:26:50, :51, :53, :54, :56 with 8 rows each ("gpu" 0-7 in
# order) and :58 with 3 rows (GPUs 0-2: the log ends mid-sweep). The "index" column is 0 on every row, so it
# cannot be the GPU index: the GPUs are told apart by the "gpu" column and by the 8 rows per timestamp.
# memory.total 81559 MiB (an 80 GB H100-class part), memory.used 4 MiB, power 72.16-74.31 W, 32-36 C: eight
# idle GPUs. First sample 2025-09-08 09:26:50 UTC = 1757323610 unix s, last 17:26:58+08:00 = 1757323618. No
# utilisation column.


def test_gpu_glasses_log_is_placed_on_the_clock_by_its_own_zone() -> None:
    kind, a = parsed("nvidia-smi/gpu_glasses_h100x8_idle.csv")
    assert kind == "nvidia_smi_csv"
    assert a["samples"] == 43
    assert (a["start_unix_s"], a["end_unix_s"]) == (1757323610.0, 1757323618.0)
    assert a["mean_power_draw_w"] == pytest.approx(73.42, abs=0.01)
    assert a["max_temperature_gpu_c"] == 36.0
    assert codes(kind, a) == set()  # no utilisation column, no DCGM: nothing to conclude


def test_gpu_glasses_log_has_eight_gpus() -> None:
    # 'gpu' (0-7, never repeated within a timestamp) is the GPU id; the 'index' column (0 on every row)
    # would repeat within each timestamp and is not trusted.
    _, a = parsed("nvidia-smi/gpu_glasses_h100x8_idle.csv")
    assert a["gpu_count"] == 8
    assert sorted(g["samples"] for g in a["gpus"]) == [5, 5, 5, 5, 5, 6, 6, 6]
    assert a["gpu_assignment"]["method"] == "gpu column (GPU index)"


# --- SuperBench's ncu CSV of an fp8 cuBLASLt GEMM (microsoft/superbenchmark, MIT) ---------------------------
# By hand, from the 62 lines: `ncu --csv` details page (header "ID","Process ID",...,"Estimated Speedup"), the
# default `--set basic` sections (GPU Speed Of Light Throughput, Launch Statistics, Occupancy, GPU and Memory
# Workload Distribution) and their rule rows, for one launch (ID 0) of
# cutlass3x_sm100_tensorop_s64x256x32gemm_f8_f8_f32_f16_f16_..._bias_f16_relu_aux_scalemax in process 371693
# (cublaslt_gemm), device 0, CC 10.0 (Blackwell), "# SMs" 152. Its metric rows end with an empty extra cell
# (15 values and a trailing comma under a 20-column header), its rule rows fill all 20.
# - Launch: block (384, 1, 1), grid (9, 32, 1) = 288 blocks ("Grid Size" 288), 288 x 384 = 110,592 threads
#   ("Threads" 110592), 1.89 waves per SM; 168 registers per thread.
# - Duration 406,240 ns = 0.40624 ms. Compute (SM) Throughput 23.59 %, Memory Throughput 21.68 %, DRAM
#   0.74 %, L1/TEX 23.23 %, L2 15.12 %: both SOL throughputs are under ncu's 60 % line, and its own
#   SOLBottleneck rule says so ("low compute throughput and memory bandwidth ... latency issues"). Not
#   memory-bound: DRAM is at 0.74 % of peak.
# - The program's own line "2208 2048 5608 0 358.154755 141.598150" (m n k, time us, TFLOPS): 2 x 2208 x
#   2048 x 5608 = 50.72 GFLOP in 358.15 us = 141.6 TFLOPS of fp8 -- a small GEMM, not a full-rate one.
# - The kernel is a CUTLASS tensor-op GEMM by name (tensorop, f8), so its time is tensor-core time; `--set
#   basic` collects no tensor-pipe counter, so the tensor pipe's activity is unknown (not 0).
# One tensor-core kernel, latency-limited: tensor_cores_idle (it is a tensor-op kernel), memory_bound (DRAM
# 0.74 %, ncu says latency) and launch_overhead (one launch) must all stay silent.


def test_superbench_ncu_gemm_is_a_latency_limited_tensor_op_launch_and_no_finding() -> None:
    kind, a = parsed("ncu/superbench_cublaslt_fp8_gemm_sm100.csv")
    assert kind == "ncu_csv"
    assert a["kernel_launches"] == 1 and a["distinct_kernels"] == 1
    (k,) = a["kernels"]
    assert k["kernel"].startswith("cutlass3x_sm100_tensorop_s64x256x32gemm_f8_f8_f32")
    assert k["total_duration_ms"] == pytest.approx(0.40624)
    assert (k["sm_throughput_pct"], k["memory_throughput_pct"], k["dram_throughput_pct"]) == (
        23.59,
        21.68,
        0.74,
    )
    assert (k["block_dim"], k["grid_dim"]) == ("(384, 1, 1)", "(9, 32, 1)")
    assert k["metrics"]["grid_size"] == 288 and k["metrics"]["threads"] == 288 * 384
    assert k["metrics"]["num_sms"] == 152
    assert k["bound"] == "latency" and k["ncu_verdict"] == "latency"
    assert a["bound_time_share_pct"] == {"latency": 100.0}
    tc = a["tensor_cores"]
    assert k["math_class"] == "tensor" and tc["tensor_core_time_pct"] == 100.0
    assert tc["tensor_pipe_active_pct"] is None and tc["tensor_pipe_measured_kernels"] == 0
    assert codes(kind, a) == set()
