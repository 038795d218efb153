"""The demo's profiler traces: small Kineto documents attached to the host-sync job and to every seed run
(`loader.attach_traces`), each with the step structure its finding needs."""

from __future__ import annotations

import json
from typing import Any


def host_sync_trace(steps: int = 6, kernels_per_step: int = 20, syncs_per_step: int = 3) -> bytes:
    """A small Kineto trace whose step calls cudaStreamSynchronize (think `.item()`) a few times."""
    events: list[dict[str, Any]] = []
    t, corr = 1000.0, 1
    every = max(1, kernels_per_step // syncs_per_step)
    for step in range(steps):
        step_start = t
        for k in range(kernels_per_step):
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": t, "dur": 6.0, "args": {"correlation": corr}})  # fmt: skip
            events.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n",
                           "pid": 0, "tid": 7, "ts": t + 8, "dur": 120.0,
                           "args": {"correlation": corr, "stream": 7, "device": 0}})  # fmt: skip
            corr, t = corr + 1, t + 130
            if k % every == 0:
                events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1,
                               "tid": 1, "ts": t, "dur": 400.0, "args": {"correlation": corr}})  # fmt: skip
                corr, t = corr + 1, t + 900  # the CPU waits, then prepares the next launch: the GPU idles
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1,
                       "tid": 1, "ts": step_start, "dur": t - step_start})  # fmt: skip
    trace = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}],
        "distributedInfo": {"rank": 0, "world_size": 8, "backend": "nccl"},
        "traceEvents": events,
    }
    return json.dumps(trace).encode()


SEED_GEMM = {
    "NVIDIA A100-SXM4-80GB": (
        "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16"
    ),
    "NVIDIA H100 80GB HBM3": (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize1x1x1_wgmma"
    ),
}


SEED_NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


class _Trace:
    """Kineto Chrome-trace events (documented format: X events, cpu_op / cuda_runtime / kernel categories,
    correlation ids linking a launch to its kernel, ProfilerStep#N annotations, baseTimeNanoseconds)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.corr = 0

    def cpu(self, name: str, ts: float, dur: float, cat: str = "cpu_op") -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                            "args": {}})  # fmt: skip

    def kernel(self, name: str, launch_ts: float, ts: float, dur: float, stream: int = 7) -> None:
        self.corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                            "ts": launch_ts, "dur": 5.0, "args": {"correlation": self.corr}})  # fmt: skip
        args = {"device": 0, "stream": stream, "correlation": self.corr}
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts,
                            "dur": dur, "args": args})  # fmt: skip

    def document(self, gpu: str, sms: int, rank: int, world: int, start_unix: float, span_us: float) -> bytes:
        window = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": 1,
                  "ts": 0.0, "dur": span_us}  # fmt: skip
        return json.dumps({
            "schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": gpu, "numSms": sms}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "baseTimeNanoseconds": int(start_unix * 1e9),
            "traceEvents": [*self.events, window],
        }).encode()  # fmt: skip


def seed_input_trace(start_unix: float, steps: int = 3) -> bytes:
    """Seed case 1, run 1 (rank 0 of 8 A100s): each 2 s step opens with the main process in the
    DataLoader for 1.2 s (0.45 s waiting for the workers, then tokenising: seed 002 section 4.1) while the
    GPU has nothing queued, then 40 GEMMs of 15 ms launched 20 ms apart (0.8 s, 75 % busy).
    Hand-derived: DataLoader 60 % of the step, the GPU idle under it the whole time -> an input stall."""
    t = _Trace()
    step = 2_000_000.0
    for k in range(steps):
        s = k * step
        t.cpu(f"ProfilerStep#{k + 1}", s, step, cat="user_annotation")
        t.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", s, 1_200_000.0)
        for i in range(40):
            at = s + 1_200_000.0 + 20_000.0 * i
            t.cpu("aten::mm", at, 30.0)
            t.kernel(SEED_GEMM["NVIDIA A100-SXM4-80GB"], at + 20.0, at + 40.0, 15_000.0)
    return t.document("NVIDIA A100-SXM4-80GB", 108, 0, 8, start_unix, steps * step + 100.0)


def seed_collective_trace(start_unix: float, steps: int = 3) -> bytes:
    """Seed case 2 (rank 0 of 32 H100s): each 1.5 s step is 1.0 s of GEMMs (50 x 20 ms, back to back)
    then a 0.5 s all-reduce that no compute overlaps. Hand-derived: communication 33 % of the step, 0 %
    overlapped -> an exposed collective."""
    t = _Trace()
    step = 1_500_000.0
    for k in range(steps):
        s = k * step
        t.cpu(f"ProfilerStep#{k + 1}", s, step, cat="user_annotation")
        for i in range(50):
            at = s + 20_000.0 * i
            t.cpu("aten::mm", at, 30.0)
            t.kernel(SEED_GEMM["NVIDIA H100 80GB HBM3"], at + 10.0, at + 40.0, 19_950.0)
        t.cpu("nccl:all_reduce", s + 1_000_000.0, 60.0)
        t.kernel(SEED_NCCL, s + 1_000_010.0, s + 1_000_050.0, 499_900.0)
    return t.document("NVIDIA H100 80GB HBM3", 132, 0, 32, start_unix, steps * step + 100.0)


SEED_ELEMENTWISE = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>"
)


SEED_TINY = "void at::native::elementwise_kernel<128, 2, at::native::AUnaryFunctor<float, float, float>>"


SEED_FUSED = "triton_per_fused__to_copy_add_mul_native_layer_norm_0"


def _lora_blocks(t: _Trace, start: float, between: str, between_us: float) -> float:
    """Case 1's forward and backward GEMM work, the same in every run (the batch did not change): 40 GEMMs
    of 15 ms, each followed by a `between_us` kernel `between` (element-wise; fused: Triton), back to back on
    the GPU while the host launches ahead. Returns where the GPU work ends."""
    gemm = SEED_GEMM["NVIDIA A100-SXM4-80GB"]
    at = start
    for _ in range(40):
        t.cpu("aten::mm", at - 40.0, 30.0)
        t.kernel(gemm, at - 20.0, at, 15_000.0)
        t.kernel(between, at - 10.0, at + 15_000.0, between_us)
        at += 15_000.0 + between_us
    return at


def seed_tiny_kernels_trace(start_unix: float, steps: int = 3) -> bytes:
    """Seed case 1, run 2 (input fixed, 0.97 s steps, 68 % busy): the batch is ready (DataLoader 2 ms,
    prefetched by the workers), the same 40 GEMMs plus a 1.5 ms element-wise kernel each (0.66 s), then an
    unfused optimizer over the LoRA parameters: 770 kernels of 1-3 us, each launched after ~0.4 ms of
    Python on the host (seed 002 section 4.1: "many 1-3 us kernels"). Hand-derived: GPU idle 31.8 % of
    the step, all of it in launch gaps under 1 ms with the host busy; 91 % of the kernels under 10 us."""
    t = _Trace()
    step = 970_000.0
    for k in range(steps):
        s = k * step
        t.cpu(f"ProfilerStep#{k + 1}", s, step, cat="user_annotation")
        t.cpu("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", s, 2_000.0)
        at = _lora_blocks(t, s + 2_000.0, SEED_ELEMENTWISE, 1_500.0)
        for j in range(770):
            t.cpu("aten::add_", at, 380.0)
            t.kernel(SEED_TINY, at + 385.0, at + 395.0, 1.0 + j % 3)
            at += 400.0
    return t.document("NVIDIA A100-SXM4-80GB", 108, 0, 8, start_unix, steps * step + 100.0)


def seed_fused_trace(start_unix: float, steps: int = 3) -> bytes:
    """Seed case 1, run 3 (torch.compile, 0.78 s steps, 85 % busy): the same 40 GEMMs each followed by one
    fused Triton kernel of 1.6 ms (0.664 s), the optimizer fused into two kernels, and 0.112 s of host
    time in the optimizer step with the GPU idle (not the input pipeline, no launch gaps, no sync: the
    remainder the seed's author left, "limited by power and communication"). Hand-derived: GPU busy 85.4 %
    of the step, no rule's pattern."""
    t = _Trace()
    step = 780_000.0
    for k in range(steps):
        s = k * step
        t.cpu(f"ProfilerStep#{k + 1}", s, step, cat="user_annotation")
        t.cpu("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", s, 2_000.0)
        at = _lora_blocks(t, s + 2_000.0, SEED_FUSED, 1_600.0)
        t.cpu("Optimizer.step#AdamW.step", at, s + step - at - 100.0)
        for _ in range(2):
            t.kernel("triton_for_fused__foreach_addcdiv_mul_0", at + 10.0, at + 20.0, 1_000.0)
            at += 1_000.0
    return t.document("NVIDIA A100-SXM4-80GB", 108, 0, 8, start_unix, steps * step + 100.0)


def seed_overlapped_trace(start_unix: float, steps: int = 3) -> bytes:
    """Seed case 2 after the fix (rank 0 of 32 H100s, 1.05 s steps): the same 1.0 s of GEMMs (50 x 20 ms),
    the gradients all-reduced in five 90 ms buckets on NCCL's own stream as the backward pass produces
    them (from 0.5 s into the step), and only the last 50 ms bucket after the compute. Hand-derived:
    communication 0.5 s a step as before, 90 % of it overlapped with compute; 0.05 s exposed."""
    t = _Trace()
    step = 1_050_000.0
    gemm = SEED_GEMM["NVIDIA H100 80GB HBM3"]
    for k in range(steps):
        s = k * step
        t.cpu(f"ProfilerStep#{k + 1}", s, step, cat="user_annotation")
        for i in range(50):
            at = s + 20_000.0 * i
            t.cpu("aten::mm", at, 30.0)
            t.kernel(gemm, at + 10.0, at + 40.0, 19_950.0)
        for j in range(5):
            at = s + 500_000.0 + 100_000.0 * j
            t.cpu("nccl:all_reduce", at, 60.0)
            t.kernel(SEED_NCCL, at + 10.0, at + 50.0, 90_000.0, stream=13)
        t.cpu("nccl:all_reduce", s + 1_000_000.0, 60.0)
        t.kernel(SEED_NCCL, s + 1_000_010.0, s + 1_000_050.0, 49_900.0, stream=13)
    return t.document("NVIDIA H100 80GB HBM3", 132, 0, 32, start_unix, steps * step + 100.0)


#: Every seed run's profiler trace (rank 0, captured 30 minutes into the job), with the step structure of
#: its metrics: 2 s -> 0.97 s -> 0.78 s for case 1, 1.5 s -> 1.05 s for case 2.
SEED_TRACES = {
    "demo-seed1-run1": seed_input_trace,
    "demo-seed1-run2": seed_tiny_kernels_trace,
    "demo-seed1-run3": seed_fused_trace,
    "demo-seed2": seed_collective_trace,
    "demo-seed2-run2": seed_overlapped_trace,
}
