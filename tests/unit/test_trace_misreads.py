"""The three misread cases of issue #12, as small Kineto traces built from the documented format.

Each trace is hand-laid so its shares of the step can be derived by hand (comments), then parsed by the
real parser, analysed, and diagnosed. Steps are 100 ms (100 000 us) ``ProfilerStep#N`` ranges on the
main thread (pid 1, tid 1); GPU ops run on device 0, stream 7. Timestamps are microseconds relative to
``baseTimeNanoseconds`` (the capture starts 2025-12-01 12:00:00 UTC).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from jobs.diagnosis import diagnose
from jobs.diagnosis.base import ArtifactAnalysis, DiagnosisInput, Finding
from jobs.profiling.kineto import parse_kineto
from jobs.profiling.trace_analysis import analyze_trace

STEP = 100_000.0  # us
BASE_NS = 1_764_590_400_000_000_000  # 2025-12-01T12:00:00Z
CONV = (
    "sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x32_stage4_warpsize2x2x1_"
    "g1_tensor16x8x16_execute_kernel_cudnn"
)
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>"
FFMA_GEMM = (
    "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_"
    "execute_kernel__5x_cublas"
)
BF16_GEMM = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16"


@dataclass
class TraceBuilder:
    """Kineto Chrome-trace events, with correlation ids handed out in order."""

    events: list[dict[str, Any]] = field(default_factory=list)
    corr: int = 0

    def cpu(self, name: str, ts: float, dur: float, cat: str = "cpu_op") -> None:
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}}
        )

    def runtime(self, name: str, ts: float, dur: float) -> int:
        self.corr += 1
        self.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": name,
                "pid": 1,
                "tid": 1,
                "ts": ts,
                "dur": dur,
                "args": {"correlation": self.corr},
            }
        )
        return self.corr

    def gpu(self, cat: str, name: str, ts: float, dur: float, corr: int, **args: Any) -> None:
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 0,
                "tid": 7,
                "ts": ts,
                "dur": dur,
                "args": {"device": 0, "stream": 7, "correlation": corr, **args},
            }
        )

    def launch(self, kernel: str, launch_ts: float, kernel_ts: float, kernel_dur: float) -> None:
        """cudaLaunchKernel (4 us) at `launch_ts` whose kernel runs [kernel_ts, +kernel_dur)."""
        corr = self.runtime("cudaLaunchKernel", launch_ts, 4.0)
        self.gpu("kernel", kernel, kernel_ts, kernel_dur, corr)

    def steps(self, n: int) -> None:
        for k in range(n):
            self.cpu(f"ProfilerStep#{k + 1}", k * STEP, STEP, cat="user_annotation")

    def document(self, n_steps: int) -> bytes:
        end = n_steps * STEP
        trace_window = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": 1}
        return json.dumps(
            {
                "schemaVersion": 1,
                "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "numSms": 108}],
                "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8},
                "baseTimeNanoseconds": BASE_NS,
                "traceEvents": [*self.events, {**trace_window, "ts": 0.0, "dur": end + 100.0}],
            }
        ).encode()


def run(doc: bytes, dtype: str = "bf16") -> tuple[dict[str, Any], dict[str, Finding]]:
    analysis = analyze_trace(parse_kineto(doc))
    findings = diagnose(
        DiagnosisInput(
            signals=None,
            gpu_count=8,
            dtype=dtype,
            artifacts=[ArtifactAnalysis("kineto", analysis, "trace.json.gz", 3)],
            # Known dollars rank findings by their impact: $1000/day of GPUs, half of it wasted.
            cost_per_day_usd=1000.0,
            waste_per_day_usd=500.0,
        )
    )
    # unexplained_waste (not a trace rule) takes whatever part of the $500/day the trace findings leave.
    return analysis["ranks"][0], {f.code: f for f in findings if f.code != "unexplained_waste"}


# ----------------------------------------------------------------------- ResNet50-like, DataLoader


def resnet(num_workers: int, n_steps: int = 4) -> bytes:
    """A ResNet50-like step: 500 us slots, each a 120 us launch gap then a 380 us kernel.

    Each kernel's launching op (aten::convolution, 110 us of host work with its cudaLaunchKernel at
    +100 us) covers 110 us of the 120 us gap before it: the host is busy launching in the gaps.
    num_workers=4: the loader's __next__ takes 840 us at the step start (0.84 % of the step) and
    200 slots fill the step. num_workers=0: the loader takes the first 40 ms of the step in the main
    process, while the GPU has nothing queued, then 120 slots fill the remaining 60 ms.
    """
    b = TraceBuilder()
    b.steps(n_steps)
    for k in range(n_steps):
        s = k * STEP
        if num_workers:
            b.cpu("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", s, 840.0)
            first, slots = s, 200
        else:
            b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", s, 40_000.0)
            first, slots = s + 40_000.0, 120
        for i in range(slots):
            t = first + 500.0 * i
            b.cpu("aten::convolution", t, 110.0)
            b.launch(CONV if i % 2 else ELEMENTWISE, t + 100.0, t + 120.0, 380.0)
    return b.document(n_steps)


def test_resnet_with_workers_is_launch_overhead_not_an_input_stall() -> None:
    rank, found = run(resnet(num_workers=4))
    ga, ip = rank["gpu_idle_attribution"], rank["input_pipeline"]
    # DataLoader: 840 us of a 100 ms step = 0.84 %; the GPU idles under it only in the two 120 us gaps
    # it covers ([s, s+120) and [s+500, s+620)): 240 us = 0.24 %.
    assert ip["dataloader_step_pct"] == pytest.approx(0.84)
    assert ip["iterator"] == "multi_process"
    assert ga["input_pct"] == pytest.approx(0.24)
    # Idle: 200 gaps x 120 us = 24 ms = 24 % of the step, all shorter than 1 ms; less the 0.24 % under
    # the loader, 23.76 % are launch gaps, 110 of every 120 us of them covered by the launching op.
    assert ga["idle_pct"] == pytest.approx(24.0)
    assert ga["launch_gaps_pct"] == pytest.approx(23.76)
    assert ga["launch_gaps_host_busy_pct"] == pytest.approx(100 * 110 / 120, abs=0.01)
    assert "data_pipeline_stall" not in found
    assert set(found) == {"launch_overhead"}
    f = found["launch_overhead"]
    assert f.impact == pytest.approx(0.2376)
    assert "num_workers" not in f.recommendation
    assert "captured" in f.title


def test_resnet_without_workers_is_an_input_stall_ranked_above_launch_overhead() -> None:
    rank, found = run(resnet(num_workers=0))
    ga, ip = rank["gpu_idle_attribution"], rank["input_pipeline"]
    # DataLoader: 40 ms of 100 = 40 %; the GPU is idle the whole time (the previous step's last kernel
    # ended at the step start), so 40 % of the step is GPU idle waiting for input.
    assert ip["dataloader_step_pct"] == pytest.approx(40.0)
    assert ip["iterator"] == "single_process"
    assert ga["input_pct"] == pytest.approx(40.0)
    # The first slot's 120 us gap continues the 40 ms idle stretch (a long gap: "other", 0.12 %); the
    # other 119 gaps of 120 us are launch gaps: 14.28 %.
    assert ga["launch_gaps_pct"] == pytest.approx(14.28)
    assert ga["other_pct"] == pytest.approx(0.12)
    assert ga["idle_pct"] == pytest.approx(54.4)
    assert {"data_pipeline_stall", "launch_overhead"} <= set(found)
    stall, launch = found["data_pipeline_stall"], found["launch_overhead"]
    assert stall.impact == pytest.approx(0.40) and launch.impact == pytest.approx(0.1428)
    # Ranked by measured share: the stall's dollars come first.
    assert stall.waste_per_day_usd > launch.waste_per_day_usd
    assert stall.severity.value == "warning"
    assert "num_workers=0" in stall.recommendation
    assert "captured" in stall.title


# ------------------------------------------------------------------ TorchRec-like, pageable copies


def torchrec(memory: str, n_steps: int = 3) -> bytes:
    """A step: 30 ms of launches (one 1 ms kernel per 1 ms op, back to back), then a device-to-host copy.

    The copy (aten::to > aten::_to_copy > aten::copy_ > cudaMemcpyAsync) starts at +30 ms; its 1 ms
    memcpy runs when the queue drains at +31 ms. Pageable: the call returns at +99.99 ms (the staged
    copy into pageable memory). Pinned: cudaMemcpyAsync returns at once and a cudaStreamSynchronize
    blocks until +99.99 ms instead.
    """
    b = TraceBuilder()
    b.steps(n_steps)
    for k in range(n_steps):
        s = k * STEP
        for i in range(30):
            t = s + 1000.0 * i
            b.cpu("aten::linear", t, 990.0)
            b.launch(ELEMENTWISE if i % 3 else CONV, t + 980.0, t + 990.0, 1000.0)
        b.cpu("aten::to", s + 30_000.0, 69_995.0)
        b.cpu("aten::_to_copy", s + 30_001.0, 69_993.0)
        b.cpu("aten::copy_", s + 30_002.0, 69_991.0)
        copy_end = s + 99_990.0
        if memory == "pageable":
            corr = b.runtime("cudaMemcpyAsync", s + 30_010.0, copy_end - (s + 30_010.0))
        else:
            corr = b.runtime("cudaMemcpyAsync", s + 30_010.0, 5.0)
            b.runtime("cudaStreamSynchronize", s + 30_020.0, copy_end - (s + 30_020.0))
        label = "Pageable" if memory == "pageable" else "Pinned"
        b.gpu("gpu_memcpy", f"Memcpy DtoH (Device -> {label})", s + 30_990.0, 1000.0, corr, bytes=64 << 20)
    return b.document(n_steps)


def test_torchrec_pageable_device_to_host_copies_are_host_sync_with_the_share_of_the_step() -> None:
    rank, found = run(torchrec("pageable"))
    hb, ga = rank["host_blocking"], rank["gpu_idle_attribution"]
    # Blocked: cudaMemcpyAsync [+30.01 ms, +99.99 ms) = 69.98 ms of every 100 ms step.
    assert hb["step_pct"] == pytest.approx(69.98)
    assert hb["pageable_async_copies"] == 3 and hb["pinned_async_copies"] == 0
    # Host busy: 30 ops x 0.99 ms + the aten::to stack [+30, +99.995) = 99.695 ms; 69.98 / 99.695.
    assert hb["cpu_time_pct"] == pytest.approx(100 * 69.98 / 99.695, abs=0.01)
    site = hb["sites"][0]
    assert site["site"] == "aten::to > aten::_to_copy > aten::copy_ > cudaMemcpyAsync (DtoH, pageable)"
    assert site["count"] == 3
    # GPU busy 31 ms a step (30 kernels + the 1 ms copy). Idle gaps over the 300 ms: [0, 0.99) before
    # the first kernel, [31.99, 100.99) and [131.99, 200.99) (69 ms each), [231.99, 300) (68.01 ms):
    # 207 ms = 69 %. Host_sync: each long gap is under the blocked call until +99.99 ms (68 ms), then
    # the relaunch after it returned (the drain: 1 ms, the last one cut at the capture end after 10 us):
    # 69 + 69 + 68.01 = 206.01 ms = 68.67 %. The first head gap, before any copy, is a launch gap
    # (0.99 ms = 0.33 %).
    assert ga["idle_pct"] == pytest.approx(69.0)
    assert ga["host_sync_pct"] == pytest.approx(68.67)
    assert ga["launch_gaps_pct"] == pytest.approx(0.33)
    assert "data_pipeline_stall" not in found
    f = found["host_sync"]
    assert f.impact == pytest.approx(0.6867)
    assert f.severity.value == "warning"
    assert "pinned" in f.recommendation and "pageable" in f.recommendation
    assert any("aten::copy_ > cudaMemcpyAsync (DtoH, pageable)" in e.label for e in f.evidence)
    assert max(found.values(), key=lambda x: x.waste_per_day_usd or 0).code == "host_sync"


def test_pinned_copies_with_a_stream_sync_get_no_pinning_advice() -> None:
    rank, found = run(torchrec("pinned"))
    hb = rank["host_blocking"]
    # The same 69.97 ms of blocking, now in cudaStreamSynchronize [+30.02, +99.99); the copy is pinned.
    assert hb["step_pct"] == pytest.approx(69.97)
    assert hb["pageable_async_copies"] == 0 and hb["pinned_async_copies"] == 3
    assert [k["kind"] for k in hb["by_kind"]] == ["synchronize"]
    f = found["host_sync"]
    assert f.impact == pytest.approx(0.6867)  # the same GPU idle as with pageable copies
    assert "pin_memory" not in f.recommendation and "pageable" not in f.recommendation
    assert "synchronize" in f.recommendation


# ------------------------------------------------------------------------------ FP32 FFMA GEMMs


def gemms(kernel: str, n_steps: int = 3) -> bytes:
    """Per step: 10 GEMMs of 8.65 ms and 135 element-wise kernels of 100 us, queued back to back.

    GEMM time = 86.5 ms of the 100 ms of kernels per step (86.5 %). The host launches all 145 kernels in
    the first 725 us, so the GPU never waits.
    """
    b = TraceBuilder()
    b.steps(n_steps)
    for k in range(n_steps):
        s = k * STEP
        t = s + 10.0
        for i in range(145):
            gemm = i % 15 == 0 and i // 15 < 10  # i = 0, 15, ..., 135
            name, dur = (kernel, 8650.0) if gemm else (ELEMENTWISE, 100.0)
            b.launch(name, s + 5.0 * i, t, dur)
            t += dur
    return b.document(n_steps)


def test_ffma_gemms_are_simt_and_show_idle_tensor_cores() -> None:
    rank, found = run(gemms(FFMA_GEMM))
    tc = rank["tensor_cores"]
    # 10 x 8.65 ms of 100 ms of compute kernels per step are FFMA GEMMs: SIMT, not tensor-core time
    # (the old allowlist read "xmma_gemm" and counted them as 86.5 % tensor-core time).
    assert tc["simt_compute_time_pct"] == pytest.approx(86.5)
    assert tc["tensor_core_compute_time_pct"] == pytest.approx(0.0)
    f = found["tensor_cores_idle"]
    # impact = compute share of the span (100 %) x SIMT share (86.5 %) x 0.75 saved = 0.649.
    assert f.impact == pytest.approx(rank["temporal_breakdown"]["compute_pct"] / 100 * 0.865 * 0.75, abs=1e-3)
    assert any("SIMT kernel" in e.label and "ffma" in e.label for e in f.evidence)
    assert "captured" in f.title
    # An fp32 job is not expected to use tensor cores: no finding.
    assert "tensor_cores_idle" not in run(gemms(FFMA_GEMM), dtype="fp32")[1]


def test_bf16_gemms_use_tensor_cores_and_nothing_fires() -> None:
    rank, found = run(gemms(BF16_GEMM))
    assert rank["tensor_cores"]["tensor_core_compute_time_pct"] == pytest.approx(86.5)
    assert rank["tensor_cores"]["simt_compute_time_pct"] == pytest.approx(0.0)
    assert found == {}


# ------------------------------------------------------------------------------ capture window


def test_trace_findings_are_anchored_to_the_capture_window() -> None:
    doc = torchrec("pageable")
    analysis = analyze_trace(parse_kineto(doc))
    cap = analysis["capture"]
    # The "PyTorch Profiler (0)" span [0, 300.1 ms) on baseTimeNanoseconds.
    assert cap["start_unix"] == pytest.approx(BASE_NS / 1e9)
    assert cap["end_unix"] == pytest.approx(BASE_NS / 1e9 + 0.3001)
    assert cap["gpu_names"] == ["NVIDIA A100-SXM4-80GB"]
    assert cap["ranks"] == [3] and cap["world_size"] == 8
    assert "baseTimeNanoseconds" in cap["source"]
    _, found = run(doc)
    assert found["host_sync"].windows == [(cap["start_unix"], cap["end_unix"])]
