"""Artifact kind detection from a file name and its first bytes, and the bounded readers."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from jobs.profiling.detect import (
    HEAD_BYTES,
    REJECTED_KINDS,
    SUPPORTED_KINDS,
    decode_text,
    detect_kind,
    load_bytes,
    read_head,
)
from jobs.profiling.errors import ArtifactError
from tests.conftest import sample_path

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize(
    ("relative", "kind"),
    [
        ("kineto/hta_alexnet_a100.json.gz", "kineto"),
        ("kineto/hta_cpu_only_rank34.json.gz", "kineto"),
        ("kineto/hta_v100_2rank_rank1.json.gz", "kineto"),
        ("kineto/tbplugin_gpu_metrics_input.json", "kineto"),
        ("nsys/nsysai_minimal_rtx3080.sqlite", "nsys_sqlite"),
        ("nsys/nsysai_h100_2gpu_train_300ms.sqlite", "nsys_sqlite"),
        ("nvidia-smi/nanogpt_8gpu_util_power.csv", "nvidia_smi_csv"),
        ("pyspy/pyspy_bpe_tokenizer.speedscope.json", "pyspy_speedscope"),
        ("pyspy/pyspy_readme_flamegraph.svg", "svg"),
    ],
)
def test_real_samples(relative: str, kind: str) -> None:
    path = sample_path(relative)
    assert detect_kind(path.name, read_head(path)) == kind


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("nsys_stats_stdout_2024.txt", "nsys_stats_csv"),
        ("nsys_stats_2021_column.txt", "nsys_stats_csv"),
        ("run1_cuda_gpu_kern_sum.csv", "nsys_stats_csv"),
        ("run1_cuda_gpu_trace.csv", "nsys_stats_csv"),
        ("ncu_details_2022.csv", "ncu_csv"),
        ("ncu_details_2024.csv", "ncu_csv"),
        ("ncu_raw.csv", "ncu_csv"),
        ("pyspy_train_subprocesses.txt", "pyspy_raw"),
        ("pyspy_train_plain.txt", "pyspy_raw"),
        ("nvidia_smi_units.csv", "nvidia_smi_csv"),
        ("nvidia_smi_noheader_nounits.csv", "nvidia_smi_csv"),
        ("dstat_0.7.2.csv", "dstat_csv"),
        ("dstat_0.7.3.csv", "dstat_csv"),
    ],
)
def test_fixtures(name: str, kind: str) -> None:
    path = DATA / name
    assert detect_kind(name, read_head(path)) == kind
    assert kind in SUPPORTED_KINDS


def test_name_does_not_decide_the_kind() -> None:
    # An upload named .txt that holds a Kineto trace is still a Kineto trace.
    assert detect_kind("upload.txt", b'{"schemaVersion": 1, "traceEvents": []}') == "kineto"


def test_gzip_prefix_is_enough() -> None:
    path = sample_path("kineto/hta_a100_nccl_allreduce_rank0.json.gz")
    head = path.read_bytes()[:4096]  # a truncated gzip stream, as read_head returns for big files
    assert detect_kind(path.name, head) == "kineto"


def test_gzipped_text_artifact() -> None:
    raw = (DATA / "nvidia_smi_units.csv").read_bytes()
    assert detect_kind("smi.csv.gz", gzip.compress(raw)) == "nvidia_smi_csv"


def test_utf16_nvidia_smi() -> None:
    # PowerShell's `>` writes UTF-16LE with a BOM.
    raw = (DATA / "nvidia_smi_units.csv").read_text().encode("utf-16")
    assert detect_kind("smi.csv", raw) == "nvidia_smi_csv"
    assert decode_text(raw).startswith("timestamp, index")


def test_html_and_svg_are_recognised_for_rejection() -> None:
    assert detect_kind("page.html", b"<!DOCTYPE html><html><body>hi</body></html>") == "html"
    assert detect_kind("x.svg", b'<svg xmlns="http://www.w3.org/2000/svg"></svg>') == "svg"
    assert "raw" in REJECTED_KINDS["svg"] and "speedscope" in REJECTED_KINDS["svg"]
    assert set(REJECTED_KINDS).isdisjoint(SUPPORTED_KINDS)


@pytest.mark.parametrize(
    ("name", "head", "message"),
    [
        ("empty.json", b"", "empty"),
        ("blank.csv", b"   \n\n", "empty"),
        ("report.nsys-rep", b"\x00\x01binary", "nsys export --type sqlite"),
        ("report.ncu-rep", b"\x00\x01binary", "--csv"),
        ("x.sqlite", b"not a database", "SQLite"),
        ("other.json", b'{"hello": "world"}', "neither"),
        ("notes.txt", b"just some notes\nabout a run\n", "Unrecognised"),
        ("blob.bin", bytes(range(256)) * 4, "binary"),
        ("bad.gz", b"\x1f\x8b\x08\x00garbage-not-deflate", "gzip"),
    ],
)
def test_unrecognised_inputs_raise(name: str, head: bytes, message: str) -> None:
    with pytest.raises(ArtifactError, match=message):
        detect_kind(name, head)


def test_read_head_is_bounded(tmp_path: Path) -> None:
    big = tmp_path / "big.csv"
    big.write_bytes(b"x" * (HEAD_BYTES + 10))
    assert len(read_head(big)) == HEAD_BYTES
    with pytest.raises(ArtifactError, match="cannot be read"):
        read_head(tmp_path / "missing.csv")


def test_load_bytes_limits(tmp_path: Path) -> None:
    path = tmp_path / "f.csv"
    path.write_bytes(b"a" * 100)
    assert load_bytes(path, 100) == b"a" * 100
    with pytest.raises(ArtifactError, match="limit"):
        load_bytes(path, 99)
    with pytest.raises(ArtifactError, match="limit"):
        load_bytes(b"a" * 100, 99)
    with pytest.raises(ArtifactError, match="cannot be read"):
        load_bytes(tmp_path / "missing.csv", 100)


def test_load_bytes_gunzips_within_the_limit() -> None:
    bomb = gzip.compress(b"0" * 1_000_000)
    assert len(bomb) < 10_000
    assert load_bytes(bomb, 2_000_000) == b"0" * 1_000_000
    with pytest.raises(ArtifactError, match="decompresses to more"):
        load_bytes(bomb, 100_000)
    with pytest.raises(ArtifactError, match="gzip"):
        load_bytes(b"\x1f\x8b\x08\x00broken", 1000)


def test_decode_text_rejects_binary() -> None:
    with pytest.raises(ArtifactError, match="binary"):
        decode_text(b"abc\x00def")
    assert decode_text("héllo".encode()) == "héllo"
    assert decode_text(b"\xef\xbb\xbfbom") == "bom"


def test_ncu_csv_after_long_program_output() -> None:
    log = "".join(f"step {i} loss 2.{i:03d}\n" for i in range(500))
    head = (
        log + (DATA / "ncu_raw.csv").read_text().split("==PROF== Disconnected from process 5120\n")[1]
    ).encode()
    assert detect_kind("ncu.csv", head) == "ncu_csv"
