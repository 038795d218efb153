"""Blocking calls, call sites and the capture block on small hand-built Kineto traces."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from jobs.diagnosis import artifacts as A
from jobs.diagnosis.base import ArtifactAnalysis
from jobs.profiling.capture import MAX_CHARS, capture_from_nvidia_smi, make_capture
from jobs.profiling.host_blocking import api_name
from jobs.profiling.kineto import parse_kineto
from jobs.profiling.monitoring import analyze_nvidia_smi
from jobs.profiling.trace_analysis import analyze_trace
from tests.unit.test_trace_misreads import ELEMENTWISE, TraceBuilder


def rank_of(b: TraceBuilder, n_steps: int = 1) -> dict[str, Any]:
    return analyze_trace(parse_kineto(b.document(n_steps)))["ranks"][0]


def kinds(rank: dict[str, Any]) -> dict[str, int]:
    return {k["kind"]: k["count"] for k in rank["host_blocking"]["by_kind"]}


def test_api_names_lose_version_and_per_thread_suffixes() -> None:
    assert api_name("cudaMemcpy_v3020") == "cudaMemcpy"
    assert api_name("cudaStreamSynchronize_ptsz") == "cudaStreamSynchronize"
    assert api_name("cuMemcpyDtoH_v2") == "cuMemcpyDtoH"


def test_each_kind_of_blocking_call() -> None:
    b = TraceBuilder()
    b.steps(1)
    b.launch(ELEMENTWISE, 0.0, 10.0, 100.0)
    # Synchronous copy (blocking whatever the memory), pinned async copy (not blocking), pageable async
    # copy (blocking), HIP's blocking copy, explicit syncs, cudaFree.
    c = b.runtime("cudaMemcpy", 200.0, 50.0)
    b.gpu("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 210.0, 20.0, c, bytes=1024)
    c = b.runtime("cudaMemcpyAsync", 300.0, 5.0)
    b.gpu("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 310.0, 20.0, c, bytes=1024)
    c = b.runtime("cudaMemcpyAsync", 400.0, 60.0)
    b.gpu("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 410.0, 20.0, c, bytes=1024)
    b.runtime("hipMemcpyWithStream", 500.0, 10.0)
    b.runtime("cudaStreamSynchronize", 600.0, 10.0)
    b.runtime("cudaDeviceSynchronize", 700.0, 10.0)
    b.runtime("cudaEventSynchronize", 800.0, 10.0)
    b.runtime("cudaFree", 900.0, 10.0)
    b.runtime("cudaLaunchKernel", 950.0, 4.0)  # not blocking
    rank = rank_of(b)
    assert kinds(rank) == {
        "synchronous_copy": 2,
        "pageable_async_copy": 1,
        "synchronize": 3,
        "implicit_sync": 1,
    }
    hb = rank["host_blocking"]
    assert hb["pageable_async_copies"] == 1 and hb["pinned_async_copies"] == 1
    # 50 + 60 + 10 + 3 x 10 + 10 = 160 us blocked of the 100 ms step.
    assert hb["blocked_ms"] == pytest.approx(0.16)
    assert hb["step_pct"] == pytest.approx(0.16)


def test_item_counts_only_on_gpu_tensors_and_once_per_call_site() -> None:
    b = TraceBuilder()
    b.steps(1)
    b.launch(ELEMENTWISE, 0.0, 10.0, 100.0)
    # A CPU tensor's .item(): no runtime call inside, not blocking.
    b.cpu("aten::item", 200.0, 3.0)
    # A GPU tensor's .item() inside the loss: the D2H copy and the sync it encloses are one site.
    b.cpu("loss_fn", 300.0, 400.0)
    b.cpu("aten::item", 310.0, 300.0)
    b.cpu("aten::_local_scalar_dense", 311.0, 298.0)
    c = b.runtime("cudaMemcpyAsync", 320.0, 5.0)
    b.gpu("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 330.0, 2.0, c, bytes=4)
    b.runtime("cudaStreamSynchronize", 330.0, 270.0)
    rank = rank_of(b)
    hb = rank["host_blocking"]
    assert kinds(rank)["item"] == 1  # the outer aten::item; _local_scalar_dense is inside it
    sites = {s["site"]: s for s in hb["sites"]}
    assert "loss_fn > aten::item" in sites
    assert sites["loss_fn > aten::item"]["time_ms"] == pytest.approx(0.3)
    assert not any("cudaStreamSynchronize" in s for s in sites)  # counted once, as the item
    # The blocked union is the item op [310, 610): 300 us.
    assert hb["blocked_ms"] == pytest.approx(0.3)


def test_relative_clock_gives_an_unknown_capture_time() -> None:
    doc = {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 5.0, "dur": 1.0, "args": {}},
        ]
    }
    cap = analyze_trace(parse_kineto(json.dumps(doc).encode()))["capture"]
    assert cap["start_unix"] is None and cap["end_unix"] is None
    assert cap["source"].startswith("kineto: unknown")
    assert cap["gpu_names"] == [] and cap["ranks"] == [] and cap["world_size"] is None


def test_make_capture_keeps_the_contract_whatever_it_is_given() -> None:
    cap = make_capture(
        gpu_names=["A" * 500, "", 3, "NVIDIA H100 80GB HBM3"],
        start_unix=math.nan,
        end_unix=math.inf,
        ranks=[2, -1, True, 2, "3"],
        world_size=0,
        source="x" * 1000,
    )
    assert cap["start_unix"] is None and cap["end_unix"] is None
    assert [len(n) for n in cap["gpu_names"]] == [MAX_CHARS, len("NVIDIA H100 80GB HBM3")]
    assert cap["ranks"] == [2] and cap["world_size"] is None
    assert len(cap["source"]) == MAX_CHARS
    # A relative clock read as epoch (1970) is not a capture time; an end before the start is dropped.
    assert make_capture(start_unix=12.0, end_unix=20.0, source="s")["start_unix"] is None
    late = make_capture(start_unix=1.7e9, end_unix=1.6e9, source="s")
    assert late["start_unix"] == 1.7e9 and late["end_unix"] is None


def test_stored_captures_are_read_defensively() -> None:
    for capture in (None, "x", {"start_unix": "1", "end_unix": 2.0}, {"start_unix": 2e9, "end_unix": 1e9}):
        assert A.capture_window(ArtifactAnalysis("kineto", {"capture": capture})) == []
    ok = ArtifactAnalysis("kineto", {"capture": {"start_unix": 1.7e9, "end_unix": 1.7e9 + 5}})
    assert A.capture_window(ok) == [(1.7e9, 1.7e9 + 5)]


def test_nvidia_smi_logs_get_their_capture_from_the_timestamps_and_names() -> None:
    csv = (
        b"timestamp, name, index, utilization.gpu [%]\n"
        b"2025/12/01 12:00:00.000, NVIDIA H100 80GB HBM3, 0, 97 %\n"
        b"2025/12/01 12:00:00.000, NVIDIA H100 80GB HBM3, 1, 95 %\n"
        b"2025/12/01 12:00:05.000, NVIDIA H100 80GB HBM3, 0, 98 %\n"
        b"2025/12/01 12:00:05.000, NVIDIA H100 80GB HBM3, 1, 96 %\n"
    )
    analysis = analyze_nvidia_smi(csv)
    cap = capture_from_nvidia_smi(analysis)
    assert cap["gpu_names"] == ["NVIDIA H100 80GB HBM3"] * 2
    assert cap["start_unix"] == pytest.approx(1_764_590_400.0)
    assert cap["end_unix"] == pytest.approx(1_764_590_405.0)
    assert cap["ranks"] == [] and "timestamp" in cap["source"]
    assert A.capture_of(analysis) == cap  # stored analyses without the block get it derived
