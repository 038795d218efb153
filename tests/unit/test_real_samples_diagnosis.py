"""Every real artifact in ../shared/samples through the real parser and the diagnosis, with its expected
findings pinned and the reason for each, read from what the file shows.

The diagnosis gets the artifact alone (no metrics, no dollars): `DiagnosisInput(signals=None, ...)` with the
default declared dtype (bf16). Numbers in the comments are the analysis' own (shares are % of the profiled
steps: `gpu_idle_attribution`, `host_blocking`, `input_pipeline`, `tensor_cores`). Skips when the samples
are absent.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from jobs.diagnosis import artifacts as A
from jobs.diagnosis import diagnose
from jobs.diagnosis.base import ArtifactAnalysis, DiagnosisInput, Finding
from jobs.profiling import monitoring, nsys, pyspy
from jobs.profiling.errors import ArtifactError
from jobs.profiling.kineto import parse_kineto
from jobs.profiling.schema.common import declared_paths
from jobs.profiling.schema.trace import TraceRank
from jobs.profiling.trace_analysis import analyze_trace
from tests.conftest import SAMPLES, sample_path

pytestmark = pytest.mark.skipif(
    not SAMPLES.is_dir(), reason=f"{SAMPLES} is absent: real sample artifacts are not available here"
)

#: Codes whose trace part this suite owns the windows of (they must be the capture window).
TRACE_CODES = {"data_pipeline_stall", "launch_overhead", "host_sync", "host_device_copy", "tensor_cores_idle"}


@cache
def analysis_of(relative: str) -> tuple[str, dict[str, Any]]:
    """(artifact kind, analysis) of one sample, through the parser its format uses."""
    path = sample_path(relative)
    if relative.startswith("kineto/"):
        return "kineto", analyze_trace(parse_kineto(path))
    if relative.startswith("nsys/"):
        return "nsys_sqlite", analyze_trace(nsys.parse_nsys(path))
    if relative.startswith("pyspy/"):
        return "pyspy_speedscope", pyspy.analyze_pyspy(path, filename=path.name)
    if relative.startswith("nvidia-smi/"):
        return "nvidia_smi", monitoring.analyze_nvidia_smi(path)
    raise AssertionError(f"no parser for {relative}")


def findings_of(relative: str, dtype: str = "bf16") -> dict[str, Finding]:
    kind, analysis = analysis_of(relative)
    art = ArtifactAnalysis(kind=kind, analysis=analysis, name=Path(relative).name)
    found = diagnose(DiagnosisInput(signals=None, gpu_count=8, dtype=dtype, artifacts=[art]))
    return {f.code: f for f in found}


EXPECTED: dict[str, set[str]] = {
    # TorchRec, rank 0 of 128: ncclKernel_SendRecv is 65 % of kernel time, 195 ms of communication with
    # 12 % overlapped -> communication_wait. Its 55 % GPU idle is 45.5 % long gaps (>= 1 ms) with the
    # host outside any DataLoader (DataLoader 0 %: no stall), 9.7 % launch gaps (< 10 %: no
    # launch_overhead) and 0.27 % behind blocking calls (no host_sync).
    "kineto/hta_128rank_sampled_rank0.json.gz": {"communication_wait"},
    # Rank 1 of the same job: 168 ms of SendRecv 20 % overlapped; 7.6 % launch gaps, 0 % DataLoader.
    "kineto/hta_128rank_sampled_rank1.json.gz": {"communication_wait"},
    # TorchRec, rank 3 of 8: 12.5 % of the step in 30 us-1 ms launch gaps with the host busy 75 % of them
    # (52 % of 7140 kernels < 10 us) -> launch_overhead; 133 ms of NCCL 47 % overlapped ->
    # communication_wait; 42 ms of pinned HtoD copies = 11 % of GPU busy time -> host_device_copy
    # (pinned: no "pin it"). The CPU blocks 16 % of the step (pageable DtoH .to(), aten::item) while the
    # GPU keeps working: GPU idle from it 1.4 % -> no host_sync. DataLoader 0.09 % -> no stall.
    "kineto/hta_a100_8rank_rank3.json.gz": {"communication_wait", "launch_overhead", "host_device_copy"},
    # ResNet-like (cudnn bn), rank 0 of 2: 76 % idle, of which 53 % in 2353 launch gaps of 30 us-1 ms
    # with the host busy 85 % of them -> launch_overhead; no DataLoader ops; 24 ms of NCCL is below the
    # exposed-communication threshold. The other 22.8 % is 28 gaps of 1.6-15.7 ms, every one ended by a
    # kernel launched after the gap began (nothing queued), and in each of the 3 steps the same ones
    # while the main thread runs aten::flatten_dense_tensors (2.2 ms), aten::unflatten_dense_tensors
    # (15.5 + 7.6 ms: 396 as_strided views) and the optimizer's aten::_foreach_mul_/_foreach_add_ (4-6 ms
    # each): the GPU waits for host CPU work 19.7 % of the window (20.3 / 19.6 / 19.1 % per step) ->
    # data_pipeline_stall's host-work reading, a warning (every step).
    "kineto/hta_a100_nccl_allreduce_rank0.json.gz": {"launch_overhead", "data_pipeline_stall"},
    # AlexNet benchmark (first iterations): 52 blocking calls (3 cudaFree inside cudnn_convolution take
    # 6.5 s, 16 pageable HtoD cudaMemcpyAsync, 21 synchronize; 41 GPU-side cuda_sync records): the GPU
    # idles 15 % of the 43 s window behind them -> host_sync. 16 pageable HtoD copies (244 MB, 55 ms,
    # most of the little GPU work but 0.1 % of the span) -> host_device_copy at info, with pin advice.
    # 85 % of the idle is long gaps the trace does not explain; 79 kernels.
    "kineto/hta_alexnet_a100.json.gz": {"host_sync", "host_device_copy"},
    # ROCm MI250 mini toy, 14 kernels in a 9.3 ms step: 21.5 % launch gaps, 71 % of kernels < 10 us ->
    # launch_overhead; hipMemcpyWithStream (synchronous) + hipDeviceSynchronize idle the GPU 5.5 % ->
    # host_sync (info); 2 HtoD copies (ROCm: host memory kind unknown) are a large share of the little GPU
    # work -> host_device_copy (info).
    "kineto/hta_amd_mi250_minitoy.json.gz": {"launch_overhead", "host_sync", "host_device_copy"},
    # CPU-only (gloo) trace: no GPU ops, no GPU evidence.
    "kineto/hta_cpu_only_rank34.json.gz": set(),
    # Only cpu_op / user_annotation events: no GPU ops.
    "kineto/hta_no_distributed_info.json.gz": set(),
    # One Triton kernel (fewer than MIN_TRACE_KERNELS = 10): a smoke test, no evidence.
    "kineto/hta_triton_cuLaunchKernel.json.gz": set(),
    # V100 rank 1 of 2: 39 % of the step in 7473 launch gaps with the host busy 94 % -> launch_overhead;
    # 238 ms of NCCL all-reduce with 0 % overlap -> communication_wait; volta_sgemm/SIMT kernels are 65 % of
    # compute time in a job declared bf16 -> tensor_cores_idle (info).
    "kineto/hta_v100_2rank_rank1.json.gz": {"launch_overhead", "communication_wait", "tensor_cores_idle"},
    # V100, 5 steps, GPU idle 2.3 % (a full timeline); SIMT (volta_sgemm, scudnn) 58 % of compute under a
    # declared bf16 -> tensor_cores_idle (info). One cudaDeviceSynchronize blocks the CPU 18 % of the steps
    # while the GPU works: 0.2 % GPU idle -> no host_sync.
    "kineto/hta_v100_ns_resolution.json.gz": {"tensor_cores_idle"},
    # TensorBoard plugin sample (2021 format), one 13.4 ms step of 30 kernels all < 10 us: 85 % of it launch
    # gaps -> launch_overhead; the single-process DataLoader idles the GPU 5.4 % -> data_pipeline_stall
    # (info); aten::to's copy + stream/device syncs idle it 5.5 % -> host_sync (info).
    "kineto/tbplugin_gpu_metrics_input.json": {"launch_overhead", "data_pipeline_stall", "host_sync"},
    # The same trace with the plugin's golden counters added: the same findings.
    "kineto/tbplugin_gpu_metrics_expected.json": {"launch_overhead", "data_pipeline_stall", "host_sync"},
    # 2x H100, 300 ms: GPU idle 9 % / 11 %, launch gaps 6.3 % / 9.3 % (< 10 %), flash/nvjet tensor-core
    # kernels 65 % of compute; the CPU is blocked 52-56 % in cudaStreamSynchronize while the GPU works
    # (GPU idle from it < 1 %) -> no host_sync; ncclDevKernel_SendRecv not overlapped -> communication_wait.
    "nsys/nsysai_h100_2gpu_train_300ms.sqlite": {"communication_wait"},
    # Two kernels: too little GPU work for any trace rule.
    "nsys/nsysai_minimal_rtx3080.sqlite": set(),
    # py-spy of a BPE tokenizer: 37 % of samples in tokenization (the input pipeline) -> data_pipeline_stall
    # at info with unknown GPU cost (py-spy cannot see the GPU).
    "pyspy/pyspy_bpe_tokenizer.speedscope.json": {"data_pipeline_stall"},
    # nvidia-smi log (util 98 %, idle 0.6 % of samples): no rule reads a monitoring log without metrics.
    "nvidia-smi/nanogpt_8gpu_util_power.csv": set(),
}


def test_every_sample_is_pinned() -> None:
    files = {
        str(p.relative_to(SAMPLES))
        for p in SAMPLES.rglob("*")
        if p.is_file() and p.name != "MANIFEST.md" and p.suffix != ".svg"
    }
    assert files == set(EXPECTED)


@pytest.mark.parametrize("relative", sorted(EXPECTED))
def test_real_sample_findings(relative: str) -> None:
    found = findings_of(relative)
    assert set(found) == EXPECTED[relative]
    _, analysis = analysis_of(relative)
    window = A.capture_window(ArtifactAnalysis("x", analysis))
    # Without ProfilerStep a rank's findings cover its steady state (first kernel to last GPU activity,
    # issue #24), not the start-up before it; with ProfilerStep the captured window.
    steady = {
        (r["phases"]["window_start_unix"], r["phases"]["window_end_unix"])
        for r in analysis.get("ranks", [])
        if (r.get("phases") or {}).get("basis") == "gpu_span"
    }
    for code, f in found.items():
        if code in TRACE_CODES and any(s.endswith("trace") for s in f.sources):
            # Trace findings cover the analysed window, not the whole job.
            assert f.windows == window or set(f.windows) <= steady, code
            for start, end in f.windows:
                assert window[0][0] - 1e-6 <= start <= end <= window[0][1] + 1e-6, code


def test_the_svg_flame_graph_is_refused() -> None:
    path = sample_path("pyspy/pyspy_readme_flamegraph.svg")
    with pytest.raises(ArtifactError, match="SVG"):
        pyspy.analyze_pyspy(path, filename=path.name)


def test_fp32_declared_v100_traces_do_not_expect_tensor_cores() -> None:
    assert "tensor_cores_idle" not in findings_of("kineto/hta_v100_ns_resolution.json.gz", dtype="fp32")


def test_recommendations_follow_the_copies_memory_kind() -> None:
    pinned = findings_of("kineto/hta_a100_8rank_rank3.json.gz")["host_device_copy"]
    assert "already use pinned" in pinned.recommendation and "pin it" not in pinned.recommendation
    pageable = findings_of("kineto/hta_alexnet_a100.json.gz")["host_device_copy"]
    assert pageable.recommendation.startswith("Most copies use pageable host memory: pin it")
    sync = findings_of("kineto/hta_alexnet_a100.json.gz")["host_sync"]
    assert "cudaFree" in sync.recommendation
    assert any("cudnn_convolution > cudaFree" in e.label for e in sync.evidence)


# Capture blocks: (gpu name, GPUs listed, start unix s, end unix s, ranks, world size).
CAPTURES: dict[str, tuple[str | None, int, float | None, float | None, list[int], int | None]] = {
    "kineto/hta_128rank_sampled_rank0.json.gz": (None, 0, 1682725897.2267, 1682725900.5941, [0], 128),
    "kineto/hta_a100_8rank_rank3.json.gz": (
        "NVIDIA A100-PG509-200",
        8,
        1661203462.5848,
        1661203463.0640,
        [3],
        8,
    ),
    "kineto/hta_a100_nccl_allreduce_rank0.json.gz": (
        "NVIDIA A100-PG509-200",
        8,
        1716423322.3881,
        1716423323.0843,
        [0],
        2,
    ),
    "kineto/hta_amd_mi250_minitoy.json.gz": (
        "AMD Radeon Graphics",
        4,
        1739836029.6030,
        1739836029.6128,
        [],
        None,
    ),
    "kineto/hta_cpu_only_rank34.json.gz": (None, 0, 1721065959.5256, 1721065960.8151, [34], 300),
    "kineto/hta_v100_2rank_rank1.json.gz": (
        "Tesla V100-SXM2-32GB",
        2,
        1669783687.3522,
        1669783689.1227,
        [1],
        2,
    ),
    # nsys: the events' own extent (issue #24), not [0, ANALYSIS_DETAILS.duration) of the session. By hand
    # (sqlite3): session start utcEpochNs 1779782330176752435; first event an NVTX range at
    # 60 111 430 336 ns, last an NVTX range ending at 60 411 416 408 ns: 299.99 ms, where the session's
    # duration says 119.44 s.
    "nsys/nsysai_h100_2gpu_train_300ms.sqlite": (None, 0, 1779782390.2882, 1779782390.5882, [], None),
    # Session start 1776781226557295056 ns; first event a runtime call at 1 304 349 703 ns, last one
    # ending at 1 540 180 135 ns (the session's duration: 1.87 s).
    "nsys/nsysai_minimal_rtx3080.sqlite": (
        "NVIDIA GeForce RTX 3080",
        1,
        1776781227.8616,
        1776781228.0975,
        [],
        None,
    ),
    "pyspy/pyspy_bpe_tokenizer.speedscope.json": (None, 0, None, None, [], None),
    "nvidia-smi/nanogpt_8gpu_util_power.csv": (None, 0, 1758685713.493, 1758685871.016, [], None),
}


@pytest.mark.parametrize("relative", sorted(CAPTURES))
def test_capture_block(relative: str) -> None:
    _, analysis = analysis_of(relative)
    cap = A.capture_of(analysis)
    assert cap is not None
    name, n_names, start, end, ranks, world = CAPTURES[relative]
    assert set(cap) == {"gpu_names", "start_unix", "end_unix", "ranks", "world_size", "source"}
    assert len(cap["gpu_names"]) == n_names and (name is None or cap["gpu_names"][0] == name)
    for got, want in ((cap["start_unix"], start), (cap["end_unix"], end)):
        assert (got is None) == (want is None)
        if want is not None:
            assert got == pytest.approx(want, abs=1e-3) and math.isfinite(got)
    assert cap["ranks"] == ranks and cap["world_size"] == world
    assert isinstance(cap["source"], str) and 0 < len(cap["source"]) <= 200


def test_every_trace_analysis_has_a_capture_block() -> None:
    for relative in EXPECTED:
        kind, analysis = analysis_of(relative)
        if kind in ("kineto", "nsys_sqlite", "pyspy_speedscope"):
            assert isinstance(analysis.get("capture"), dict), relative


#: Declared for the nsys stats / ncu tensor_cores block the trace's block shares (a trace never has them).
NOT_IN_TRACES = {"tensor_cores.compute_share_of_kernel_time_pct", "tensor_cores.tensor_pipe_active_pct"}


def _exists(obj: Any, path: list[str]) -> bool:
    if not path:
        return True
    key, rest = path[0], path[1:]
    if key.endswith("[]"):
        items = obj.get(key[:-2]) if isinstance(obj, dict) else None
        return isinstance(items, list) and any(_exists(i, rest) for i in items)
    return isinstance(obj, dict) and key in obj and _exists(obj[key], rest)


def test_keys_the_schema_declares_exist_in_real_trace_analyses() -> None:
    # The trace schema must stay true: every rank key the rules can read (schema.trace.TraceRank) is in
    # what the parsers write (for each key, some real sample has it: pageable/pinned copies, SIMT kernels
    # and blocking sites differ by sample). A parser rename fails here instead of silently reading None.
    paths = [p for p in declared_paths(TraceRank) if p not in NOT_IN_TRACES]
    assert "gpu_idle_attribution.host_work.top_ops[].idle_pct" in paths
    ranks = [
        r for rel in EXPECTED if rel.startswith(("kineto/", "nsys/")) for r in analysis_of(rel)[1]["ranks"]
    ]
    for path in paths:
        assert any(_exists(r, path.split(".")) for r in ranks), path


def test_the_strict_fast_path_and_the_field_walk_decode_real_analyses_alike() -> None:
    # lenient() converts a payload that fits in one msgspec call, else walks it field by field: both
    # must read every real analysis the same way.
    from jobs.profiling.schema.common import _info, _struct, lenient
    from jobs.profiling.schema.monitoring import MonitoringAnalysis
    from jobs.profiling.schema.pyspy import PySpyAnalysis
    from jobs.profiling.schema.trace import TraceAnalysis

    for relative in EXPECTED:
        kind, analysis = analysis_of(relative)
        cls = {"pyspy_speedscope": PySpyAnalysis, "nvidia_smi": MonitoringAnalysis}.get(kind, TraceAnalysis)
        walked = _struct(analysis, _info(cls))
        assert lenient(analysis, cls) == walked, relative
