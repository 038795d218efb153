"""Nsight Systems SQLite export parsing: the real exports, schema variations, and hostile files."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from functools import cache
from pathlib import Path

import pytest

from jobs.profiling.errors import ArtifactError
from jobs.profiling.events import CopyKind, KernelClass, MemKind, OpKind, SyncKind, Trace
from jobs.profiling.nsys import parse_nsys
from jobs.profiling.safe_sqlite import GuardedSQLite
from jobs.profiling.trace_analysis import analyze_trace
from tests.conftest import sample_path

H100 = "nsys/nsysai_h100_2gpu_train_300ms.sqlite"
RTX = "nsys/nsysai_minimal_rtx3080.sqlite"


@cache
def _parsed(name: str) -> Trace:
    return parse_nsys(sample_path(name))


def load(name: str) -> Trace:
    sample_path(name)  # skip cleanly when ../shared is absent
    return _parsed(name)


def test_minimal_export_reads_kernels_memcpy_sync_and_device() -> None:
    trace = load(RTX)
    assert trace.source == "nsys"
    assert trace.metadata["export_schema_version"] == "3.24.14"
    assert len(trace.ranks) == 1
    rank = trace.ranks[0]
    kinds = rank.gpu.kind.tolist()
    assert (kinds.count(OpKind.KERNEL), kinds.count(OpKind.MEMCPY), kinds.count(OpKind.SYNC)) == (2, 1, 1)
    names = {trace.strings[int(i)] for i in rank.gpu.name}
    assert any(n.startswith("void at::native::vectorized_elementwise_kernel") for n in names)
    memcpy = rank.gpu.take(rank.gpu.kind == OpKind.MEMCPY)
    assert memcpy.copy_kind.tolist() == [CopyKind.DTOH]
    assert (memcpy.src_kind.tolist(), memcpy.dst_kind.tolist()) == ([MemKind.DEVICE], [MemKind.PINNED])
    assert memcpy.bytes.tolist() == [4]
    assert "Memcpy DtoH (Device -> Pinned)" in names
    dev = rank.devices[0]
    assert (dev.name, dev.num_sms, dev.compute_capability) == ("NVIDIA GeForce RTX 3080", 68, "8.6")
    assert rank.unix_offset_ns == 1776781226557295056
    kernels = rank.gpu.take(rank.gpu.kind == OpKind.KERNEL)
    assert kernels.grid_blocks.tolist() == [1, 1]
    assert kernels.block_threads.tolist() == [128, 16]


def test_runtime_names_lose_the_nsys_version_suffix() -> None:
    trace = load(RTX)
    names = sorted(trace.strings[int(i)] for i in trace.ranks[0].runtime.name)
    assert "cudaLaunchKernel" in names and "cudaStreamSynchronize" in names
    assert not any(n.endswith(("_v7000", "_v3020")) for n in names)


def test_sync_type_comes_from_the_exports_enum_table() -> None:
    # The export's ENUM_CUPTI_SYNC_TYPE says 2 = STREAM_WAIT_EVENT; we follow the file, not an assumption.
    rank = load(RTX).ranks[0]
    sync = rank.gpu.take(rank.gpu.kind == OpKind.SYNC)
    assert sync.sync_kind.tolist() == [SyncKind.STREAM_WAIT_EVENT]
    assert sync.stream.tolist() == [7]


def test_minimal_export_analysis() -> None:
    rank = analyze_trace(load(RTX))["ranks"][0]
    assert rank["launch_stats"]["launches"] == 3
    assert rank["memcpy"]["pinned_count"] == 1 and rank["memcpy"]["pageable_bytes_pct"] == 0.0
    assert rank["sync"]["cpu_sync_by_call"][0]["name"] == "cudaStreamSynchronize"
    assert rank["temporal_breakdown"]["idle_pct"] == pytest.approx(99.92, abs=0.01)
    assert rank["tb_gpu_metrics"]["est_sm_efficiency_pct"] is not None  # grid blocks / 68 SMs


def test_two_gpu_export_splits_into_one_rank_per_device() -> None:
    trace = load(H100)
    assert trace.metadata["export_schema_version"] == "3.25.0"
    assert [r.rank for r in trace.ranks] == [0, 1]
    counts = [
        (
            int((r.gpu.kind == OpKind.KERNEL).sum()),
            int((r.gpu.kind == OpKind.MEMCPY).sum()),
            len(r.annotations),
        )
        for r in trace.ranks
    ]
    assert counts == [(1993, 510, 9443), (2017, 510, 9675)]
    assert sum(len(r.runtime) for r in trace.ranks) == 7466
    # CUPTI records every sync with deviceId 0; they belong to the device whose process/stream they wait on.
    assert [int((r.gpu.kind == OpKind.SYNC).sum()) for r in trace.ranks] == [178, 188]
    comm = sum(int((r.gpu.kclass == KernelClass.COMMUNICATION).sum()) for r in trace.ranks)
    assert comm == 66  # ncclDevKernel_SendRecv
    assert all(r.distributed is not None and r.distributed.world_size == 2 for r in trace.ranks)
    # No TARGET_INFO_GPU table in this export: devices are known by id only.
    assert trace.ranks[0].devices[0].name == "" and trace.ranks[0].devices[0].num_sms is None


def test_two_gpu_export_analysis_regression_values() -> None:
    result = analyze_trace(load(H100))
    json.dumps(result, allow_nan=False)
    r0, r1 = result["ranks"]
    assert r0["temporal_breakdown"]["idle_pct"] == pytest.approx(8.484, abs=0.01)
    assert r0["temporal_breakdown"]["compute_pct"] == pytest.approx(84.606, abs=0.01)
    assert r1["temporal_breakdown"]["idle_pct"] == pytest.approx(10.493, abs=0.01)
    assert r0["idle_breakdown"]["host_wait_pct"] == pytest.approx(82.457, abs=0.01)
    assert r0["comm_compute_overlap"]["overlap_pct"] == 0.0
    assert r0["sync"]["cpu_sync_calls"] == 16 and r1["sync"]["cpu_sync_calls"] == 17
    assert r0["tensor_cores"]["tensor_core_time_pct"] == pytest.approx(60.78, abs=0.1)  # nvjet + flash
    assert {k["copy_kind"] for k in r0["memcpy"]["by_kind"]} == {"DtoD", "HtoD"}
    assert r0["step_times"]["count"] == 0  # NVTX carries aten ops only, no step ranges


def test_parsing_does_not_modify_the_export() -> None:
    path = sample_path(RTX)
    before = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    parse_nsys(path)
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == before


# --- synthetic exports ---------------------------------------------------------------------------

STRING_IDS = "CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)"
KERNEL = (
    "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, streamId INT, "
    "correlationId INT, globalPid INT, demangledName INT, shortName INT, gridX INT, gridY INT, gridZ INT, "
    "blockX INT, blockY INT, blockZ INT)"
)
RUNTIME = (
    "CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, eventClass INT, globalTid INT, "
    "correlationId INT, nameId INT)"
)
PID = 1234 << 24


def make_db(path: Path, *statements: str, rows: dict[str, list[tuple[object, ...]]] | None = None) -> Path:
    con = sqlite3.connect(path)
    for sql in statements:
        con.execute(sql)
    for table, values in (rows or {}).items():
        marks = ",".join("?" * len(values[0]))
        con.executemany(f"INSERT INTO {table} VALUES ({marks})", values)
    con.commit()
    con.close()
    return path


def test_kernel_table_alone_with_string_ids(tmp_path: Path) -> None:
    db = make_db(
        tmp_path / "k.sqlite",
        STRING_IDS,
        KERNEL,
        RUNTIME,
        rows={
            "StringIds": [(1, "void gemm<float>(float*)"), (2, "gemm"), (3, "cudaLaunchKernel_v7000")],
            "CUPTI_ACTIVITY_KIND_KERNEL": [
                (1000, 11000, 0, 7, 5, PID, 1, 2, 4, 2, 1, 128, 1, 1),
                (31000, 41000, 0, 7, 6, PID, 1, 2, 4, 2, 1, 128, 1, 1),
            ],
            "CUPTI_ACTIVITY_KIND_RUNTIME": [
                (0, 900, 0, PID | 1, 5, 3),
                (25000, 26000, 0, PID | 1, 6, 3),
            ],
        },
    )
    trace = parse_nsys(db)
    assert any("no CUPTI" in w for w in trace.warnings) is False
    rank = trace.ranks[0]
    assert rank.gpu.start_ns.tolist() == [1000, 31000] and rank.gpu.dur_ns.tolist() == [10000, 10000]
    assert rank.gpu.grid_blocks.tolist() == [8, 8]
    assert [trace.strings[int(i)] for i in rank.runtime.name] == ["cudaLaunchKernel"] * 2
    result = analyze_trace(trace)["ranks"][0]
    assert result["temporal_breakdown"]["idle_pct"] == 50.0
    assert result["idle_breakdown"]["host_wait_pct"] == 100.0  # second launch came after the first kernel
    assert result["launch_stats"]["launch_delay"]["max_us"] == 5.0


def test_missing_tables_give_an_empty_trace_with_warnings(tmp_path: Path) -> None:
    db = make_db(tmp_path / "empty.sqlite", "CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT)")
    trace = parse_nsys(db)
    assert trace.ranks == []
    assert any("CUPTI_ACTIVITY_KIND_KERNEL" in w for w in trace.warnings)
    assert analyze_trace(trace)["ranks"] == []


def test_older_schema_without_string_table_global_pid_or_grid(tmp_path: Path) -> None:
    db = make_db(
        tmp_path / "old.sqlite",
        "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, streamId INT, "
        "correlationId INT, shortName INT)",
        "CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start INT, end INT, deviceId INT, streamId INT, "
        "correlationId INT, syncType INT)",
        "CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, text TEXT, globalTid INT)",
        rows={
            "CUPTI_ACTIVITY_KIND_KERNEL": [(0, 100, 2, 7, 1, 9)],
            "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": [(50, 150, 2, 4294967295, 2, 4)],
            "NVTX_EVENTS": [
                (0, 200, 59, "ProfilerStep#3", 5),
                (10, None, 34, "mark", 5),
                (0, 100, 60, "step 4", 5),
            ],
        },
    )
    trace = parse_nsys(db)
    rank = trace.ranks[0]
    assert rank.rank == 2
    assert trace.strings[int(rank.gpu.name[0])] == "<string 9>"
    sync = rank.gpu.take(rank.gpu.kind == OpKind.SYNC)
    assert sync.sync_kind.tolist() == [SyncKind.CONTEXT_SYNC] and sync.stream.tolist() == [-1]
    assert sorted(trace.strings[int(i)] for i in rank.annotations.name) == ["ProfilerStep#3", "step 4"]
    steps = analyze_trace(trace)["ranks"][0]["step_times"]
    assert steps["source"] == "NVTX ProfilerStep" and steps["steps"][0]["duration_ms"] == 0.0002


def test_a_view_is_never_read_as_a_table(tmp_path: Path) -> None:
    db = make_db(
        tmp_path / "view.sqlite",
        "CREATE TABLE real (start INT, end INT, deviceId INT, streamId INT, correlationId INT)",
        "CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS SELECT * FROM real",
        rows={"real": [(0, 10, 0, 7, 1)]},
    )
    trace = parse_nsys(db)
    assert trace.ranks == []


def test_the_connection_is_read_only(tmp_path: Path) -> None:
    db = make_db(tmp_path / "ro.sqlite", STRING_IDS)
    reader = GuardedSQLite(db, timeout_s=5)
    try:
        with pytest.raises(ArtifactError):
            reader.execute("CREATE TABLE x (a INT)")
        with pytest.raises(ArtifactError):
            reader.execute("INSERT INTO StringIds VALUES (1, 'x')")
    finally:
        reader.close()


def test_a_slow_query_is_stopped_at_the_time_limit(tmp_path: Path) -> None:
    rows = [(i, i + 10, 0, 7, i, PID, 1, 1, 1, 1, 1, 1, 1, 1) for i in range(50_000)]
    db = make_db(tmp_path / "big.sqlite", STRING_IDS, KERNEL, rows={"CUPTI_ACTIVITY_KIND_KERNEL": rows})
    with pytest.raises(ArtifactError, match="longer than"):
        parse_nsys(db, timeout_s=0.0)


def test_not_an_sqlite_file_raises_artifact_error(tmp_path: Path) -> None:
    bad = tmp_path / "trace.sqlite"
    bad.write_bytes(b'{"traceEvents": []}')
    with pytest.raises(ArtifactError, match="not an SQLite database"):
        parse_nsys(bad)


def test_corrupt_sqlite_file_raises_artifact_error(tmp_path: Path) -> None:
    bad = tmp_path / "corrupt.sqlite"
    bad.write_bytes(b"SQLite format 3\x00" + b"\xde\xad\xbe\xef" * 1024)
    with pytest.raises(ArtifactError):
        parse_nsys(bad)


def test_missing_file_raises_artifact_error(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="cannot be read"):
        parse_nsys(tmp_path / "nope.sqlite")
