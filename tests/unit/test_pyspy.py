"""py-spy raw and speedscope profiles: classification, hot frames, the bounded icicle tree."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import orjson
import pytest

from jobs.profiling.errors import ArtifactError
from jobs.profiling.pyspy import CLASSES, analyze_pyspy, frame_class
from jobs.profiling.pyspy_parse import Frame, parse_pyspy
from tests.conftest import sample_path

DATA = Path(__file__).parent / "data"


def _one_profile(samples: list, weights: list) -> bytes:
    profile = {"type": "sampled", "samples": samples, "weights": weights}
    return orjson.dumps({"profiles": [profile], "shared": {"frames": [{"name": "a"}]}})


def _check_icicle(icicle: dict, max_nodes: int) -> None:
    ids, parents, values = icicle["ids"], icicle["parents"], icicle["values"]
    assert len(ids) == len(set(ids)) == len(parents) == len(values) == len(icicle["labels"])
    assert len(ids) <= max_nodes
    value_of = dict(zip(ids, values, strict=True))
    children: dict[str, float] = {}
    for node, parent in zip(ids, parents, strict=True):
        if parent:
            assert parent in value_of, f"{node}'s parent {parent} was dropped"
            children[parent] = children.get(parent, 0.0) + value_of[node]
    for parent, total in children.items():  # branchvalues="total" needs parent >= sum(children)
        assert total <= value_of[parent] + 1e-6


def test_speedscope_sample() -> None:
    result = analyze_pyspy(sample_path("pyspy/pyspy_bpe_tokenizer.speedscope.json"))
    json.dumps(result, allow_nan=False)
    assert result["format"] == "pyspy_speedscope"
    assert result["samples"] == 10_181
    assert result["weight_unit"] == "seconds"
    assert result["total_weight"] == pytest.approx(101.81)
    assert len(result["threads"]) == 4
    assert result["threads"][0]["thread"].endswith('"MainThread"')
    classes = result["classes_pct"]
    assert set(classes) == set(CLASSES)
    assert sum(classes.values()) == pytest.approx(100.0, abs=0.01)
    # The main thread runs the BPE trainer (bpe.py); the pool's helper threads sit in multiprocessing.
    assert classes["tokenization"] == pytest.approx(100 * 38.07 / 101.81, abs=0.01)
    assert classes["stdlib"] == pytest.approx(100 - classes["tokenization"], abs=0.01)
    assert result["input_pipeline_pct"] == classes["tokenization"]
    hot = {row["label"]: row for row in result["hot_inclusive"]}
    assert hot["bpe_encode (cs336_basics/bpe.py)"]["class"] == "tokenization"
    # 3 MainThread samples stop in train_bpe.py's <module>, outside bpe_encode (but still tokenisation).
    assert hot["bpe_encode (cs336_basics/bpe.py)"]["inclusive_pct"] == pytest.approx(
        100 * 38.04 / 101.81, abs=0.01
    )
    icicle = result["icicle"]
    assert icicle["ids"][0] == "n0" and icicle["labels"][0] == "all" and icicle["parents"][0] == ""
    assert icicle["values"][0] == pytest.approx(101.81)
    _check_icicle(icicle, 2000)


def test_icicle_is_bounded_with_other_nodes() -> None:
    path = sample_path("pyspy/pyspy_bpe_tokenizer.speedscope.json")
    icicle = analyze_pyspy(path, max_nodes=12)["icicle"]
    _check_icicle(icicle, 12)
    assert "other" in icicle["labels"]
    assert icicle["total_nodes"] > 12
    # What was dropped is still accounted for: root's children sum to the total.
    root_children = [v for p, v in zip(icicle["parents"], icicle["values"], strict=True) if p == "n0"]
    assert sum(root_children) == pytest.approx(101.81)


def test_raw_with_processes_and_threads() -> None:
    result = analyze_pyspy(DATA / "pyspy_train_subprocesses.txt")
    json.dumps(result, allow_nan=False)
    assert result["format"] == "pyspy_raw" and result["weight_unit"] == "samples"
    assert result["samples"] == 1808
    threads = {t["thread"]: t["share_pct"] for t in result["threads"]}
    assert threads["thread (31337): MainThread"] == pytest.approx(100 * 1091 / 1808, abs=0.01)
    classes = result["classes_pct"]
    # Waiting in DataLoader.__next__ (412), reading files in a worker (64), pinning memory (41).
    assert classes["data_loading"] == pytest.approx(100 * 517 / 1808, abs=0.01)
    assert classes["tokenization"] == pytest.approx(100 * 515 / 1808, abs=0.01)
    assert classes["collate"] == pytest.approx(100 * 97 / 1808, abs=0.01)
    assert classes["framework"] == pytest.approx(100 * (233 + 301 + 88) / 1808, abs=0.01)
    assert classes["user_code"] == pytest.approx(100 * 57 / 1808, abs=0.01)
    assert result["input_pipeline_pct"] == pytest.approx(100 * 1129 / 1808, abs=0.01)
    top = result["hot_self"][0]
    assert top["function"] == "_batch_encode_plus" and top["class"] == "tokenization"
    labels = result["icicle"]["labels"]
    assert 'process 31337:"python train.py --config configs/gpt2_small.yaml"' in labels
    assert "thread (31390): Thread-2 (_pin_memory_loop)" in labels
    _check_icicle(result["icicle"], 2000)


def test_raw_without_thread_frames_or_line_numbers() -> None:
    result = analyze_pyspy(DATA / "pyspy_train_plain.txt")
    assert result["samples"] == 360
    assert result["threads"] == [{"thread": "(all threads)", "share_pct": 100.0}]
    assert result["classes_pct"]["framework"] == pytest.approx(100 * 300 / 360, abs=0.01)
    # "main (train.py)" (no line) and "main (train.py:198)" are one node.
    mains = [label for label in result["icicle"]["labels"] if label == "main (train.py)"]
    assert len(mains) == 1


def test_evented_speedscope_profile() -> None:
    doc = {
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": {"frames": [{"name": "main", "file": "train.py"}, {"name": "encode", "file": "tok.py"}]},
        "profiles": [
            {
                "type": "evented",
                "name": "MainThread",
                "unit": "milliseconds",
                "startValue": 0,
                "endValue": 10,
                "events": [
                    {"type": "O", "frame": 0, "at": 0},
                    {"type": "O", "frame": 1, "at": 2},
                    {"type": "C", "frame": 1, "at": 8},
                    {"type": "C", "frame": 0, "at": 10},
                ],
            }
        ],
    }
    result = analyze_pyspy(orjson.dumps(doc))
    assert result["total_weight"] == pytest.approx(10.0)
    assert result["weight_unit"] == "milliseconds"
    assert result["classes_pct"]["tokenization"] == pytest.approx(60.0)
    assert result["classes_pct"]["user_code"] == pytest.approx(40.0)


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        (Frame("_batch_encode_plus", "transformers/tokenization_utils_fast.py", 539), "tokenization"),
        (Frame("encode", "tiktoken/core.py", 120), "tokenization"),
        (Frame("encode_ordinary", "mytok.py", 10), "tokenization"),
        (Frame("encode", "json/encoder.py", 199), "stdlib"),
        (Frame("bpe_encode", "/home/u/proj/bpe.py", 218), "tokenization"),
        (Frame("default_collate", "torch/utils/data/_utils/collate.py", 317), "collate"),
        (Frame("my_collate_fn", "train.py", 40), "collate"),
        (Frame("_worker_loop", "torch/utils/data/_utils/worker.py", 308), "data_loading"),
        (Frame("__getitem__", "data/text_dataset.py", 47), "data_loading"),
        (Frame("__getitem__", "/home/u/proj/heapmap.py", 41), "user_code"),
        (Frame("get_batch", "train.py", 116), "data_loading"),
        (Frame("forward", "torch/nn/modules/linear.py", 116), "framework"),
        (Frame("forward", "/opt/venv/lib/python3.11/site-packages/flash_attn/x.py", 3), "framework"),
        (Frame("wait", "threading.py", 331), "stdlib"),
        (Frame("wait", "/usr/lib/python3.11/threading.py", 331), "stdlib"),
        (Frame("_find_and_load", "<frozen importlib._bootstrap>", 1176), "stdlib"),
        (Frame("__init__", "<string>", 2), "user_code"),
        (Frame("forward", "model.py", 54), "user_code"),
        (Frame("thread (31337): MainThread", "", 0, "thread"), "thread"),
    ],
)
def test_frame_class(frame: Frame, expected: str) -> None:
    assert frame_class(frame) == expected


def test_svg_is_refused_with_advice() -> None:
    with pytest.raises(ArtifactError, match="py-spy raw output"):
        parse_pyspy(sample_path("pyspy/pyspy_readme_flamegraph.svg"))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not py-spy raw"),
        (b"hello world\nthis is not a profile\n", "not py-spy raw"),
        (b"{not json", "not valid JSON"),
        (b"[1, 2, 3]", "profiles"),
        (b'{"profiles": []}', "shared.frames"),
        (b'{"profiles": [], "shared": {"frames": []}}', "no samples"),
        (b'{"profiles": [1], "shared": {"frames": []}}', "not an object"),
        (_one_profile([[0]], []), "equal length"),
        (_one_profile([[5]], [1]), "frame 5"),
        (_one_profile(["x"], [1]), "malformed sample"),
        (b'{"profiles": [{"type": "evented", "events": 3}], "shared": {"frames": []}}', "events"),
    ],
)
def test_malformed_profiles_raise(content: bytes, message: str) -> None:
    with pytest.raises(ArtifactError, match=message):
        analyze_pyspy(content)


def test_a_few_bad_raw_lines_are_skipped() -> None:
    content = b"main (train.py:1);step (train.py:5) 10\ngarbage line\nmain (train.py:1) 3\n"
    result = analyze_pyspy(content)
    assert result["samples"] == 13 and result["skipped_lines"] == 1


def test_size_limit() -> None:
    with pytest.raises(ArtifactError, match="limit"):
        analyze_pyspy(DATA / "pyspy_train_plain.txt", max_bytes=10)


def test_truncated_files_parse_or_raise_artifact_error() -> None:
    speedscope = sample_path("pyspy/pyspy_bpe_tokenizer.speedscope.json").read_bytes()
    for data in (speedscope, (DATA / "pyspy_train_subprocesses.txt").read_bytes()):
        for cut in range(0, len(data), max(1, len(data) // 30)):
            with contextlib.suppress(ArtifactError):
                json.dumps(analyze_pyspy(data[:cut]), allow_nan=False)


def test_icicle_nodes_are_numbered_in_file_order_whatever_order_the_tree_is_built_in() -> None:
    from jobs.profiling.pyspy import _icicle
    from jobs.profiling.pyspy_parse import parse_pyspy_raw

    # Built from sorted stacks (a;b, a;b;d, a;c), numbered as first met in the file: a, b, c, then d.
    profile = parse_pyspy_raw(
        "a (m.py:1);b (m.py:2) 1\na (m.py:1);c (m.py:3) 2\na (m.py:1);b (m.py:2);d (m.py:4) 3\n"
    )
    icicle = _icicle(profile, 100)
    by_id = dict(
        zip(
            icicle["ids"],
            zip(icicle["labels"], icicle["parents"], icicle["values"], strict=True),
            strict=True,
        )
    )
    assert by_id == {
        "n0": ("all", "", 6.0),
        "n1": ("a (m.py)", "n0", 6.0),
        "n2": ("b (m.py)", "n1", 4.0),  # 1 + the 3 below d
        "n3": ("c (m.py)", "n1", 2.0),
        "n4": ("d (m.py)", "n2", 3.0),
    }
