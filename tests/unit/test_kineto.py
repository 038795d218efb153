"""Kineto (PyTorch profiler) trace parsing: every real sample, schema variants, and malformed uploads."""

from __future__ import annotations

import gzip
import io
import json
import time
import zlib
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jobs.profiling.errors import ArtifactError
from jobs.profiling.events import (
    AnnotationSource,
    CopyKind,
    KernelClass,
    MemKind,
    OpKind,
    RuntimeKind,
    StringTable,
    SyncKind,
    Trace,
    combine_traces,
    hta_kernel_class,
)
from jobs.profiling.kineto import parse_kineto, read_trace_bytes
from tests.conftest import sample_path


@cache
def _parsed(name: str) -> Trace:
    return parse_kineto(sample_path(f"kineto/{name}"))


def load(name: str) -> Trace:
    """Parse a shared sample once per test session (skips when ../shared is absent)."""
    sample_path(f"kineto/{name}")  # skip before touching the cache
    return _parsed(name)


def kineto_bytes(events: list[dict[str, Any]], **top: Any) -> bytes:
    return json.dumps({"schemaVersion": 1, "traceEvents": events, **top}).encode()


# name -> (rank, kernels, memcpy, memset, sync, runtime calls) as counted in the raw files.
SAMPLE_COUNTS = {
    "hta_amd_mi250_minitoy.json.gz": (0, 14, 2, 0, 0, 21),
    "hta_cpu_only_rank34.json.gz": (34, 0, 0, 0, 0, 0),
    "hta_alexnet_a100.json.gz": (0, 79, 16, 3, 41, 361),
    "hta_v100_2rank_rank1.json.gz": (1, 19370, 2040, 880, 0, 42373),
    "hta_no_distributed_info.json.gz": (0, 0, 0, 0, 0, 0),
    "hta_a100_nccl_allreduce_rank0.json.gz": (0, 2700, 960, 114, 0, 8740),
    "hta_v100_ns_resolution.json.gz": (0, 4350, 1600, 145, 0, 15329),
    "hta_a100_8rank_rank3.json.gz": (3, 8568, 228, 654, 0, 24692),
    "hta_128rank_sampled_rank0.json.gz": (0, 1154, 40, 10, 0, 1204),
    "hta_128rank_sampled_rank1.json.gz": (1, 1104, 40, 10, 0, 1154),
    "hta_triton_cuLaunchKernel.json.gz": (0, 1, 0, 0, 0, 2),
    "tbplugin_gpu_metrics_input.json": (0, 30, 2, 0, 0, 42),
}


@pytest.mark.parametrize("name", sorted(SAMPLE_COUNTS))
def test_every_sample_parses_with_the_event_counts_of_the_raw_file(name: str) -> None:
    trace = load(name)
    assert trace.source == "kineto"
    assert len(trace.ranks) == 1
    rank = trace.ranks[0]
    exp_rank, kernels, memcpy, memset, sync, runtime = SAMPLE_COUNTS[name]
    kinds = rank.gpu.kind
    assert rank.rank == exp_rank
    assert int((kinds == OpKind.KERNEL).sum()) == kernels
    assert int((kinds == OpKind.MEMCPY).sum()) == memcpy
    assert int((kinds == OpKind.MEMSET).sum()) == memset
    assert int((kinds == OpKind.SYNC).sum()) == sync
    assert len(rank.runtime) == runtime
    # Columns are aligned and durations never negative.
    assert len({len(getattr(rank.gpu, f)) for f in ("start_ns", "dur_ns", "stream", "name", "kclass")}) == 1
    assert (rank.gpu.dur_ns >= 0).all()


def test_nccl_kernels_are_classified_as_communication_like_hta() -> None:
    rank = load("hta_a100_nccl_allreduce_rank0.json.gz").ranks[0]
    names = [load("hta_a100_nccl_allreduce_rank0.json.gz").strings[int(i)] for i in rank.gpu.name]
    comm = [n for n, c in zip(names, rank.gpu.kclass.tolist(), strict=True) if c == KernelClass.COMMUNICATION]
    assert len(comm) == 21
    assert sum(n.startswith("ncclKernel_AllReduce") for n in comm) == 15
    assert sum(n.startswith("ncclKernel_Broadcast") for n in comm) == 6
    rank8 = load("hta_a100_8rank_rank3.json.gz").ranks[0]
    assert int((rank8.gpu.kclass == KernelClass.COMMUNICATION).sum()) == 60


def test_distributed_info_device_properties_and_clock_anchor_are_read() -> None:
    rank = load("hta_a100_nccl_allreduce_rank0.json.gz").ranks[0]
    assert rank.distributed is not None
    assert (rank.distributed.rank, rank.distributed.world_size, rank.distributed.backend) == (0, 2, "nccl")
    assert rank.distributed.nccl_version == "2.17.1"
    assert len(rank.devices) == 8
    assert rank.devices[0].name == "NVIDIA A100-PG509-200"
    assert rank.devices[0].num_sms == 108
    assert rank.devices[0].compute_capability == "8.0"
    # baseTimeNanoseconds anchors the relative timestamps to the Unix epoch.
    assert rank.unix_offset_ns == 1711964646000000000
    assert rank.window_ns is not None and rank.window_ns[1] > rank.window_ns[0]


def test_cpu_only_gloo_trace_has_no_gpu_ops_but_keeps_rank_and_backend() -> None:
    trace = load("hta_cpu_only_rank34.json.gz")
    rank = trace.ranks[0]
    assert len(rank.gpu) == 0
    assert rank.distributed is not None
    assert (rank.rank, rank.distributed.world_size, rank.distributed.backend) == (34, 300, "gloo")
    assert len(rank.annotations) == 11  # gloo:all_reduce and friends


def test_missing_distributed_info_defaults_to_rank_zero_with_a_warning() -> None:
    trace = load("hta_no_distributed_info.json.gz")
    assert trace.ranks[0].rank == 0
    assert trace.ranks[0].distributed is None
    assert any("distributedInfo" in w for w in trace.warnings)
    assert len(trace.ranks[0].cpu_ops) > 0


def test_rank_override_wins_over_distributed_info() -> None:
    trace = parse_kineto(sample_path("kineto/hta_cpu_only_rank34.json.gz"), rank=7)
    assert trace.ranks[0].rank == 7


def test_nanosecond_resolution_float_timestamps_keep_sub_microsecond_digits() -> None:
    rank = load("hta_v100_ns_resolution.json.gz").ranks[0]
    assert rank.sub_us_timestamps
    # e.g. "dur": 1.28 (a DtoD memcpy) is 1280 ns, not rounded to whole microseconds.
    memcpy = rank.gpu.dur_ns[rank.gpu.kind == OpKind.MEMCPY]
    assert (memcpy % 1000 != 0).any()
    assert 1280 in set(memcpy.tolist())
    # Epoch-scale float microseconds convert without float64's ~256 ns error.
    assert (rank.gpu.start_ns % 10 == 0).mean() > 0.9


def test_integer_microsecond_traces_are_not_flagged_sub_microsecond() -> None:
    assert not load("hta_v100_2rank_rank1.json.gz").ranks[0].sub_us_timestamps


def test_rocm_trace_reads_hip_runtime_under_cuda_runtime_and_host_memcpy() -> None:
    trace = load("hta_amd_mi250_minitoy.json.gz")
    rank = trace.ranks[0]
    names = {trace.strings[int(i)] for i in rank.runtime.name}
    assert "hipMemcpyWithStream" in names
    assert any(n.startswith("hipLaunchKernel") or n.startswith("hipExtModuleLaunchKernel") for n in names)
    memcpy = rank.gpu.take(rank.gpu.kind == OpKind.MEMCPY)
    assert CopyKind.HTOD in memcpy.copy_kind.tolist()
    assert MemKind.HOST in memcpy.src_kind.tolist()  # "Host -> Device": pinned-ness unknown
    assert set(rank.gpu.stream.tolist()) == {0}
    assert len(rank.devices) == 4 and rank.devices[0].num_sms == 104
    assert int((rank.annotations.source == AnnotationSource.GPU).sum()) == 2


def test_triton_kernel_launched_through_the_driver_api_is_correlated() -> None:
    rank = load("hta_triton_cuLaunchKernel.json.gz").ranks[0]
    driver = rank.runtime.take(rank.runtime.kind == RuntimeKind.DRIVER)
    assert len(driver) == 1
    assert driver.correlation[0] == rank.gpu.correlation[0] == 35


def test_2021_schema_reads_string_stream_tids_operators_and_compute_properties() -> None:
    trace = load("tbplugin_gpu_metrics_input.json")
    rank = trace.ranks[0]
    assert trace.metadata["format"] == "kineto-2021"
    assert set(rank.gpu.stream.tolist()) == {7}
    assert rank.devices[0].num_sms == 80 and rank.devices[0].name == "Tesla V100-DGXS-32GB"
    steps = [trace.strings[int(i)] for i in rank.annotations.name]
    assert steps == ["ProfilerStep#2"]  # an "Operator" in 2021 traces, an annotation here
    assert len(rank.cpu_ops) == 178
    kernels = rank.gpu.take(rank.gpu.kind == OpKind.KERNEL)
    assert np.nanmax(kernels.blocks_per_sm) > 0


def test_memcpy_names_give_direction_and_host_memory_kind() -> None:
    rank = load("hta_alexnet_a100.json.gz").ranks[0]
    memcpy = rank.gpu.take(rank.gpu.kind == OpKind.MEMCPY)
    htod = memcpy.copy_kind == CopyKind.HTOD
    assert htod.any()
    assert set(memcpy.src_kind[htod].tolist()) == {MemKind.PAGEABLE}
    assert set(memcpy.dst_kind[htod].tolist()) == {MemKind.DEVICE}
    assert (memcpy.bytes > 0).all()


def test_cuda_sync_events_get_their_sync_kind_and_uint32_max_stream_becomes_minus_one() -> None:
    rank = load("hta_alexnet_a100.json.gz").ranks[0]
    sync = rank.gpu.take(rank.gpu.kind == OpKind.SYNC)
    kinds = sync.sync_kind.tolist()
    assert kinds.count(SyncKind.STREAM_SYNC) == 16
    assert kinds.count(SyncKind.CONTEXT_SYNC) == 5
    assert kinds.count(SyncKind.STREAM_WAIT_EVENT) == 20
    assert set(sync.stream[sync.sync_kind == SyncKind.CONTEXT_SYNC].tolist()) == {-1}
    assert set(sync.kclass.tolist()) == {KernelClass.OTHER}


def test_large_v100_trace_parses_quickly_into_compact_columns() -> None:
    path = sample_path("kineto/hta_v100_2rank_rank1.json.gz")
    start = time.perf_counter()
    trace = parse_kineto(path)
    elapsed = time.perf_counter() - start
    assert elapsed < 10.0  # ~0.6 s on a laptop core; generous for slow CI
    # 216k events held in columns: a few MB, not the ~800 MB of Python dicts a plain json.loads makes.
    assert trace.nbytes() < 20 * 2**20


def test_path_bytes_and_file_object_sources_parse_identically() -> None:
    path = sample_path("kineto/hta_alexnet_a100.json.gz")
    raw = Path(path).read_bytes()
    a = parse_kineto(path)
    b = parse_kineto(raw)
    c = parse_kineto(io.BytesIO(raw))
    d = parse_kineto(gzip.decompress(raw))
    for other in (b, c, d):
        assert np.array_equal(a.ranks[0].gpu.start_ns, other.ranks[0].gpu.start_ns)
        assert a.strings.values == other.strings.values


def test_combine_traces_merges_ranks_under_one_string_table() -> None:
    combined = combine_traces(
        [load("hta_128rank_sampled_rank1.json.gz"), load("hta_128rank_sampled_rank0.json.gz")]
    )
    assert [r.rank for r in combined.ranks] == [0, 1]
    for rank, name in zip(
        combined.ranks,
        ("hta_128rank_sampled_rank0.json.gz", "hta_128rank_sampled_rank1.json.gz"),
        strict=True,
    ):
        original = load(name)
        names = [combined.strings[int(i)] for i in rank.gpu.name]
        assert names == [original.strings[int(i)] for i in original.ranks[0].gpu.name]


def test_hta_kernel_class_rules() -> None:
    assert (
        hta_kernel_class("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)") == KernelClass.COMMUNICATION
    )
    assert (
        hta_kernel_class("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)")
        == KernelClass.COMMUNICATION
    )
    assert hta_kernel_class("Memcpy DtoD (Device -> Device)") == KernelClass.MEMORY
    assert hta_kernel_class("Memset (Device)") == KernelClass.MEMORY
    assert hta_kernel_class("void at::native::vectorized_elementwise_kernel<4>") == KernelClass.COMPUTATION
    assert hta_kernel_class("Stream Sync") == KernelClass.OTHER
    # HTA's grouping: a name merely containing "Memcpy" is not compute either.
    assert hta_kernel_class("void cub::DeviceMemcpyKernel") == KernelClass.OTHER


# --- synthetic traces -------------------------------------------------------------------------------


def test_json_array_format_is_accepted_as_events_only() -> None:
    events = [
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k",
            "pid": 0,
            "tid": 7,
            "ts": 10,
            "dur": 5,
            "args": {"stream": 7},
        }
    ]
    trace = parse_kineto(json.dumps(events).encode())
    assert len(trace.ranks[0].gpu) == 1
    assert trace.ranks[0].gpu.start_ns[0] == 10_000 and trace.ranks[0].gpu.dur_ns[0] == 5_000


def test_non_complete_events_and_unknown_categories_are_skipped() -> None:
    events = [
        {
            "ph": "i",
            "cat": "cpu_instant_event",
            "name": "[memory]",
            "pid": 1,
            "tid": 1,
            "ts": 1,
            "args": {"Bytes": 4},
        },
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 1, "tid": 1, "ts": 1},
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
        {"ph": "X", "cat": "python_function", "name": "f", "pid": 1, "tid": 1, "ts": 1, "dur": 3},
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k",
            "pid": 0,
            "tid": 7,
            "ts": 2,
            "dur": 1,
            "args": {"stream": 7},
        },
        {"ph": "X", "cat": "kernel", "name": "no_dur", "pid": 0, "tid": 7, "ts": 2},
    ]
    trace = parse_kineto(kineto_bytes(events))
    rank = trace.ranks[0]
    assert len(rank.gpu) == 1 and len(rank.cpu_ops) == 0
    assert trace.metadata["event_counts_by_category"]["python_function"] == 1


def test_a_kernel_whose_stream_comes_from_a_tid_past_int64_has_an_unknown_stream() -> None:
    # No args.stream, so the stream is read from the tid; 2**70 used to overflow the int64 column and
    # fail the whole upload as a parser bug.
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 2**70, "ts": 2, "dur": 1},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 4, "dur": 1},
    ]
    rank = parse_kineto(kineto_bytes(events)).ranks[0]
    assert rank.gpu.stream.tolist() == [-1, 7]


def test_concatenated_gzip_members_are_read_whole() -> None:
    payload = kineto_bytes([])
    half = len(payload) // 2
    data = gzip.compress(payload[:half]) + gzip.compress(payload[half:])
    assert read_trace_bytes(data) == payload


# --- malformed uploads ------------------------------------------------------------------------------


def test_not_json_raises_a_clear_artifact_error() -> None:
    with pytest.raises(ArtifactError, match="not valid JSON"):
        parse_kineto(b"this is not json {")


def test_json_without_trace_events_raises_artifact_error() -> None:
    with pytest.raises(ArtifactError, match="no traceEvents"):
        parse_kineto(json.dumps({"schemaVersion": 1, "foo": []}).encode())


def test_wrong_types_raise_artifact_error_naming_the_field() -> None:
    with pytest.raises(ArtifactError, match=r"traceEvents"):
        parse_kineto(json.dumps({"traceEvents": "nope"}).encode())
    bad_ts = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "soon", "dur": 1}]}
    with pytest.raises(ArtifactError, match=r"traceEvents\[0\]\.ts"):
        parse_kineto(json.dumps(bad_ts).encode())
    with pytest.raises(ArtifactError, match="Kineto"):
        parse_kineto(b"42")


def test_empty_input_raises_artifact_error() -> None:
    with pytest.raises(ArtifactError, match="empty"):
        parse_kineto(b"")
    with pytest.raises(ArtifactError, match="empty"):
        parse_kineto(gzip.compress(b"   \n"))


def test_truncated_gzip_raises_artifact_error() -> None:
    data = gzip.compress(
        kineto_bytes([{"ph": "X", "cat": "kernel", "name": "k" * 1000, "ts": 1, "dur": 1}] * 50)
    )
    with pytest.raises(ArtifactError, match="truncated"):
        parse_kineto(data[: len(data) // 2])


def test_corrupt_gzip_raises_artifact_error() -> None:
    data = bytearray(gzip.compress(kineto_bytes([])))
    data[12:20] = b"\xff" * 8
    with pytest.raises(ArtifactError, match="gzip"):
        parse_kineto(bytes(data))


def test_gzip_bomb_beyond_the_limit_is_refused_without_inflating_it() -> None:
    # 64 MiB of zeros compress to ~64 KiB; with a 1 MiB limit we must stop early.
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b"\0" * (1 << 20)
    bomb = b"".join(comp.compress(chunk) for _ in range(64)) + comp.flush()
    assert len(bomb) < 200_000
    start = time.perf_counter()
    with pytest.raises(ArtifactError, match="decompresses to more than"):
        parse_kineto(bomb, max_decompressed_bytes=1 << 20)
    assert time.perf_counter() - start < 2.0


def test_plain_json_over_the_limit_is_refused() -> None:
    with pytest.raises(ArtifactError, match="limit"):
        parse_kineto(kineto_bytes([{"ph": "X"}] * 100), max_decompressed_bytes=100)


def test_trailing_garbage_after_gzip_is_refused() -> None:
    with pytest.raises(ArtifactError, match="trailing garbage"):
        parse_kineto(gzip.compress(kineto_bytes([])) + b"junk")


def test_unreadable_path_raises_artifact_error(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="cannot be read"):
        parse_kineto(tmp_path / "missing.json")


# -- streamed parsing ----------------------------------------------------------------------------------


def _stream_doc(n: int) -> list[dict[str, Any]]:
    """n kernels (stream 7, 10 us apart, 3 us long) each launched by a runtime call, plus flow events."""
    events: list[dict[str, Any]] = []
    for i in range(n):
        ts = 1_000_000 + 10 * i
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 2,
                "ts": ts,
                "dur": 2,
                "args": {"correlation": i},
            }
        )
        events.append({"ph": "s", "cat": "ac2g", "id": i, "pid": 1, "tid": 2, "ts": ts})
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": f"k{i % 3}",
                "pid": 0,
                "tid": 7,
                "ts": ts + 1,
                "dur": 3,
                "args": {"device": 0, "stream": 7, "correlation": i, "grid": [2, 3, 4], "block": [32, 1, 1]},
            }
        )
    return events


def _columns(trace: Trace) -> dict[str, np.ndarray]:
    rank = trace.ranks[0]
    return {
        f"{table}.{name}": getattr(getattr(rank, table), name)
        for table in ("gpu", "runtime", "cpu_ops", "annotations")
        for name in getattr(rank, table).__dataclass_fields__
    }


def _same_trace(a: Trace, b: Trace) -> None:
    assert a.strings.values == b.strings.values
    assert a.metadata == b.metadata
    assert a.warnings == b.warnings
    ca, cb = _columns(a), _columns(b)
    for key, col in ca.items():
        assert col.dtype == cb[key].dtype, key
        assert np.array_equal(col, cb[key], equal_nan=col.dtype.kind == "f"), key


def test_a_trace_cut_into_many_chunks_parses_like_one_decoded_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.profiling import kineto

    data = kineto_bytes(_stream_doc(300), distributedInfo={"rank": 2}, baseTimeNanoseconds=5)
    whole = parse_kineto(data)
    # 300 chunks of about one event pair: every cut lands between two events.
    monkeypatch.setattr(kineto, "_STREAM_CHUNK", 100)
    chunked = parse_kineto(data)
    _same_trace(whole, chunked)
    rank = chunked.ranks[0]
    assert len(rank.gpu) == 300 and len(rank.runtime) == 300  # the 300 flow events are skipped
    assert rank.rank == 2 and rank.unix_offset_ns == 5  # keys after traceEvents are read too
    assert int(rank.gpu.grid_blocks[0]) == 2 * 3 * 4 and int(rank.gpu.block_threads[0]) == 32
    assert chunked.strings.values[:4] == ["cudaLaunchKernel", "k0", "k1", "k2"]  # file order


def test_gzip_and_plain_files_stream_to_the_same_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.profiling import kineto, trace_io

    monkeypatch.setattr(kineto, "_STREAM_CHUNK", 1000)
    monkeypatch.setattr(trace_io, "READ_CHUNK", 4096)  # many gzip pieces as well
    data = kineto_bytes(_stream_doc(200))
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_bytes(data)
    packed.write_bytes(gzip.compress(data))
    _same_trace(parse_kineto(plain), parse_kineto(packed))
    assert len(parse_kineto(packed).ranks[0].gpu) == 200


def test_cuts_inside_strings_or_nested_objects_fall_back_to_the_whole_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobs.profiling import kineto

    events = _stream_doc(50)
    # Event boundaries look-alikes: "},{" inside a name and objects nested in args.
    events[11]["name"] = 'odd}, {"name"'  # a kernel
    events[20]["args"]["nested"] = [{"a": 1}, {"b": 2}, {"c": 3}]
    data = kineto_bytes(events)
    whole = parse_kineto(data)
    monkeypatch.setattr(kineto, "_STREAM_CHUNK", 50)
    _same_trace(whole, parse_kineto(data))
    assert 'odd}, {"name"' in whole.strings.values


def test_an_unknown_phase_and_a_nested_trace_events_key_parse_like_the_whole_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobs.profiling import kineto

    events = _stream_doc(40)
    events.insert(5, {"ph": "Q", "cat": "kernel", "name": "not complete", "ts": 1, "dur": 1})
    events.insert(9, {"cat": "kernel", "name": "no phase", "ts": 1, "dur": 1})
    decoy = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "decoy", "ts": 1, "dur": 1}]}
    data = kineto_bytes(events, distributedInfo=decoy)
    data = data.replace(
        b'{"schemaVersion": 1, ', b'{"distributedInfo": ' + json.dumps(decoy).encode() + b", "
    )
    whole = parse_kineto(data)
    monkeypatch.setattr(kineto, "_STREAM_CHUNK", 64)
    chunked = parse_kineto(data)
    _same_trace(whole, chunked)
    assert "decoy" not in chunked.strings.values and "not complete" not in chunked.strings.values
    assert len(chunked.ranks[0].gpu) == 40


@pytest.mark.parametrize("layout", ["event per line", "one line", "bare array", "cut inside a string"])
def test_a_plain_file_read_through_its_mapping_parses_like_its_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    # A plain file path is decoded where it lies (mmap), chunk brackets written into a copy-on-write
    # mapping and decoded pages dropped behind; bytes go through the read-buffer path. Chunks of ~5 KiB
    # over a ~120 KiB file, so pages are dropped between chunks and cuts fall on every kind of byte.
    from jobs.profiling import kineto

    events = _stream_doc(400)
    if layout == "cut inside a string":
        events[300]["name"] = "x" * 6000 + '}, {"name"'  # a boundary look-alike inside a kernel name
    data = kineto_bytes(events, distributedInfo={"rank": 3}, baseTimeNanoseconds=7)
    if layout == "event per line":
        data = data.replace(b"}, {", b"},\n  {")
    elif layout == "bare array":
        data = json.dumps(events).encode()
    path = tmp_path / "trace.json"
    path.write_bytes(data)
    expected = parse_kineto(data)
    monkeypatch.setattr(kineto, "_STREAM_CHUNK", 5000)
    mapped = parse_kineto(path)
    _same_trace(expected, mapped)
    assert len(mapped.ranks[0].gpu) == 400
    assert path.read_bytes() == data  # the brackets were written into the private mapping only
    if layout != "bare array":
        assert mapped.ranks[0].rank == 3 and mapped.ranks[0].unix_offset_ns == 7


def test_a_second_trace_events_key_after_the_array_is_decided_by_the_whole_file_decoder() -> None:
    events = _stream_doc(3)
    data = kineto_bytes(events)[:-1] + b', "traceEvents": []}'
    # JSON's last duplicate key wins in the whole-file decoder; streaming must not pick the first.
    assert len(parse_kineto(data).ranks[0].gpu) == 0


def test_names_that_are_not_strings_are_interned_as_text_in_first_seen_order() -> None:
    # A hostile or odd trace: numbers, null, a list and a string equal to a number's text as names.
    names: list[Any] = ["k", 5, "5", None, ["x"], True, "k", 1]
    events = [
        {
            "ph": "X",
            "cat": "kernel",
            "name": n,
            "pid": 0,
            "tid": 7,
            "ts": 10 * i,
            "dur": 1,
            "args": {"stream": 7},
        }
        for i, n in enumerate(names)
    ]
    trace = parse_kineto(kineto_bytes(events))
    assert trace.strings.values == ["k", "5", "", "['x']", "True", "1"]
    assert [trace.strings[int(c)] for c in trace.ranks[0].gpu.name] == [
        "k",
        "5",
        "5",
        "",
        "['x']",
        "True",
        "k",
        "1",
    ]
    table = StringTable()
    assert table.intern_each(["b", 2, "a", "b"], str).tolist() == [0, 1, 2, 0]
    assert table.values == ["b", "2", "a"]
