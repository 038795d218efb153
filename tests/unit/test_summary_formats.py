"""Summary formats reach the rules (issue #24, item 4): `nsys stats` and Nsight Compute CSVs give the
blocks a trace analysis gives (`tensor_cores`, `kernel_breakdown`, `memcpy`), and the rules read them.

Files (tests/unit/data), built from the tools' documented layouts, truths derived by hand below:

* llm_decode_bf16_cuda_gpu_kern_sum.csv: `nsys stats --report cuda_gpu_kern_sum --format csv` of a bf16
  LLM decode, 2 000 ms of kernel time. cuBLAS gemv (gemv2T_kernel_val 35.1 % + gemv2N_kernel 14.5 %) is
  49.6 %; the tensor-op GEMMs (ampere_bf16_s16816gemm 3.0 % + sm80_xmma ..._tensor16x8x16 1.2 %) 4.2 %;
  the rest element-wise, reductions, softmax, copies (no NCCL: all of it is compute by HTA's rule).
* ncu_raw_wmma_turing.csv: `ncu --csv --page raw` on an RTX 2080 Ti (CC 7.5) of a CUTLASS wmma
  tensor-op GEMM (two launches) and its FP32->FP16 cast, with sm__pipe_tensor_cycles_active
  .avg.pct_of_peak_sustained_elapsed and sm__inst_executed_pipe_tensor.sum collected.
* ncu_raw_h100_layernorm_softmax.csv: `ncu --csv` with the metric set gpu__time_duration.sum,
  sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,
  gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed, sm__throughput.avg.pct_of_peak_sustained_elapsed
  (no gpu__compute_memory_throughput), 4 steps of a bf16 GEMM (60 us), LayerNorm (120 us) and softmax
  (80 us) on an H100 (CC 9.0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.diagnosis import diagnose
from jobs.diagnosis.base import ArtifactAnalysis, DiagnosisInput, Finding
from jobs.profiling.ncu import analyze_ncu
from jobs.profiling.nsys_stats import analyze_nsys_stats

DATA = Path(__file__).parent / "data"


def _findings(kind: str, analysis: dict[str, Any], name: str, dtype: str = "bf16") -> dict[str, Finding]:
    found = diagnose(
        DiagnosisInput(
            signals=None,
            gpu_count=1,
            dtype=dtype,
            artifacts=[ArtifactAnalysis(kind, analysis, name, 0)],
            cost_per_day_usd=1000.0,
            waste_per_day_usd=500.0,
        )
    )
    return {f.code: f for f in found}


# ------------------------------------------------------------------ nsys stats: the LLM decode


def test_nsys_stats_kernel_summary_classifies_gemv_as_simt_and_gives_the_tensor_cores_block() -> None:
    analysis = analyze_nsys_stats(DATA / "llm_decode_bf16_cuda_gpu_kern_sum.csv")
    tc = analysis["tensor_cores"]
    assert tc["kernel_time_ms"] == pytest.approx(2000.0)
    assert tc["simt_compute_time_pct"] == pytest.approx(49.6)
    assert tc["tensor_core_compute_time_pct"] == pytest.approx(4.2)
    assert tc["simt_kernel_count"] == 57_344 + 24_576
    assert tc["tensor_core_kernel_count"] == 64 + 128
    assert [k["time_ms"] for k in tc["top_simt_kernels"]] == [702.0, 290.0]
    kb = analysis["kernel_breakdown"]
    assert kb["kernel_count"] == analysis["kernels"]["instances"]
    assert kb["tiny_kernels"]["count_pct"] == pytest.approx(
        analysis["kernels"]["tiny_instance_share_pct"], 1e-3
    )


def test_a_bf16_decode_dominated_by_gemv_gives_tensor_cores_idle_from_nsys_stats() -> None:
    analysis = analyze_nsys_stats(DATA / "llm_decode_bf16_cuda_gpu_kern_sum.csv")
    found = _findings("nsys_stats", analysis, "decode_cuda_gpu_kern_sum.csv")
    f = found["tensor_cores_idle"]
    assert f.sources == ["nsys stats"]
    assert f.windows == []  # a summary has no clock
    values = {e.label: e.value for e in f.evidence}
    assert values["decode_cuda_gpu_kern_sum.csv: compute-kernel time in tensor-core kernels"] == 4.2
    # Impact: 100 % compute x 49.6 % SIMT x 0.75 saved = 37.2 % of kernel time.
    assert f.impact == pytest.approx(0.372)


def test_the_same_summary_in_fp32_job_gives_no_tensor_cores_finding() -> None:
    analysis = analyze_nsys_stats(DATA / "llm_decode_bf16_cuda_gpu_kern_sum.csv")
    assert "tensor_cores_idle" not in _findings("nsys_stats", analysis, "k.csv", dtype="fp32")


def test_nsys_stats_memory_summary_gives_the_memcpy_block_by_copy_kind() -> None:
    text = (
        "Time (%),Total Time (ns),Count,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Operation\n"
        "75.0,3000000,100,30000.0,30000.0,29000,31000,100.0,[CUDA memcpy Host-to-Device]\n"
        "25.0,1000000,50,20000.0,20000.0,19000,21000,100.0,[CUDA memcpy Device-to-Host]\n"
    )
    analysis = analyze_nsys_stats(text.encode(), filename="run_cuda_gpu_mem_time_sum.csv")
    memcpy = analysis["memcpy"]
    assert [(k["copy_kind"], k["count"], k["time_ms"]) for k in memcpy["by_kind"]] == [
        ("HtoD", 100, 3.0),
        ("DtoH", 50, 1.0),
    ]
    assert memcpy["pageable_bytes_pct"] is None  # the summary does not say


# ------------------------------------------------------------------ ncu: tensor pipe and memory bound


def test_ncu_reports_the_tensor_pipe_of_a_cutlass_wmma_gemm() -> None:
    analysis = analyze_ncu(DATA / "ncu_raw_wmma_turing.csv")
    by_name = {k["kernel"].split("(")[0]: k for k in analysis["kernels"]}
    gemm = by_name["void cutlass::Kernel<cutlass_75_wmma_tensorop_f16_s161616gemm_f16_32x32_128x2_tn_align8>"]
    # Duration-weighted over the two launches: (58.84 x 412.35 + 58.97 x 409.81) / 822.16 = 58.905 %.
    assert gemm["tensor_pipe_active_pct"] == pytest.approx(58.905, abs=1e-3)
    assert gemm["tensor_pipe_metric"] == "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed"
    assert gemm["tensor_pipe_instructions"] == 2 * 1_048_576
    assert gemm["math_class"] == "tensor"
    assert gemm["bound"] == "compute"  # SM 71.6 %, memory 48.2 %
    cast = by_name["convertFP32ToFP16"]
    assert cast["tensor_pipe_active_pct"] == 0.0 and cast["math_class"] == "other"
    assert cast["bound"] == "memory"  # memory 83.9 %, SM 12.4 %
    tc = analysis["tensor_cores"]
    assert tc["tensor_pipe_measured_kernels"] == 2
    # Over all profiled time: 58.905 x 822.16 / (822.16 + 9.12) = 58.259 %.
    assert tc["tensor_pipe_active_pct"] == pytest.approx(58.259, abs=1e-3)
    assert tc["tensor_core_compute_time_pct"] == pytest.approx(100 * 822.16 / 831.28, abs=1e-3)


def test_tensor_pipe_from_cycles_when_no_ratio_was_collected() -> None:
    text = (
        '"ID","Kernel Name","gpu__time_duration.sum","sm__cycles_elapsed.avg",'
        '"sm__pipe_tensor_op_hmma_cycles_active.avg","sm__inst_executed_pipe_tensor_op_hmma.sum"\n'
        '"","","usecond","cycle","cycle","inst"\n'
        '"0","ampere_fp16_s16816gemm_fp16_256x128_ldg8_f2f_stages_64x3_nn","100.0","140,000","98,000","512"\n'
    )
    (gemm,) = analyze_ncu(text.encode())["kernels"]
    assert gemm["tensor_pipe_active_pct"] == pytest.approx(70.0)  # 98 000 / 140 000 cycles
    assert gemm["tensor_pipe_metric"] == "sm__pipe_tensor_op_hmma_cycles_active.avg / sm__cycles_elapsed.avg"
    assert gemm["tensor_pipe_instructions"] == 512


def test_memory_bound_fires_from_ncu_dram_throughput_alone() -> None:
    analysis = analyze_ncu(DATA / "ncu_raw_h100_layernorm_softmax.csv")
    by_bound = {k["kernel"].split("<")[0].split("(")[0]: k["bound"] for k in analysis["kernels"]}
    assert set(by_bound.values()) == {"memory", "compute"}
    # LayerNorm (DRAM 86.2 %, SM 24.1 %) and softmax (78.5 %, 31.0 %) are memory-bound: 4 x (120 + 80) us
    # of 4 x 260 us = 76.923 % of the profiled time; the GEMM (22.0 %, 84.3 %) compute-bound.
    assert analysis["bound_time_share_pct"] == {
        "compute": pytest.approx(23.077),
        "memory": pytest.approx(76.923),
    }
    assert all(k["memory_throughput_basis"] == "dram_throughput_pct" for k in analysis["kernels"])
    found = _findings("ncu", analysis, "ln_softmax.csv")
    f = found["memory_bound"]
    assert f.sources == ["ncu"]
    values = {e.label: e.value for e in f.evidence}
    assert values["ln_softmax.csv: kernel time in memory-bound kernels (throughputs)"] == pytest.approx(
        76.923
    )


def test_ncu_sol_bottleneck_verdicts_are_kept() -> None:
    # ncu_details_2024.csv carries SOLBottleneck rule rows: the GEMM "Compute is more heavily utilized
    # than Memory", the reduction "... below 60.0% of peak typically indicate latency issues".
    analysis = analyze_ncu(DATA / "ncu_details_2024.csv")
    verdicts = {k["kernel"].split("<")[0].split("(")[0]: k["ncu_verdict"] for k in analysis["kernels"]}
    assert verdicts["ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn"] == "compute"
    assert verdicts["void at::native::reduce_kernel"] == "latency"
    assert set(analysis["ncu_verdict_time_share_pct"]) <= {"compute", "latency", "memory"}


def test_memory_bound_fires_on_ncus_own_verdict() -> None:
    header = (
        '"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value","Rule Name",'
        '"Rule Type","Rule Description"\n'
    )
    text = header + (
        '"0","k_fused_norm","GPU Speed Of Light Throughput","Duration","us","50.0","","",""\n'
        '"0","k_fused_norm","SpeedOfLight","","","","SOLBottleneck","OPT","Memory is more heavily utilized '
        'than Compute: Look at the Memory Workload Analysis section to identify the DRAM bottleneck."\n'
    )
    analysis = analyze_ncu(text.encode())
    assert analysis["kernels"][0]["bound"] == "unknown"  # no throughputs collected
    assert analysis["ncu_verdict_time_share_pct"] == {"memory": 100.0}
    assert "memory_bound" in _findings("ncu", analysis, "n.csv")
