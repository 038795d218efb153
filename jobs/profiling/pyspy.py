"""Analyse a py-spy profile: a bounded icicle tree, hot frames and a classification of where the Python
time went (data loading, tokenisation, collate, framework...).

The files are read by `pyspy_parse` (raw collapsed stacks, speedscope JSON; SVG flame graphs refused).
"""

from __future__ import annotations

import heapq
import re
import sys
from array import array
from collections import defaultdict
from collections.abc import Hashable, Mapping
from operator import itemgetter
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from jobs.profiling.capture import make_capture
from jobs.profiling.detect import DEFAULT_MAX_BYTES
from jobs.profiling.errors import ArtifactError
from jobs.profiling.guard import checkpoint, guarded
from jobs.profiling.pyspy_parse import Frame, Profile, parse_pyspy

CLASSES = ("data_loading", "tokenization", "collate", "framework", "stdlib", "user_code")
INPUT_PIPELINE_CLASSES = ("data_loading", "tokenization", "collate")
MAX_NODES = 2000

_TOKENIZE = re.compile(r"tokeni[sz]|(^|[^a-z])bpe([^a-z]|$)|tiktoken|sentencepiece", re.IGNORECASE)
_TOKENIZE_FUNCS = frozenset(
    {
        "encode",
        "encode_batch",
        "encode_ordinary",
        "encode_ordinary_batch",
        "encode_plus",
        "_encode_plus",
        "batch_encode_plus",
        "_batch_encode_plus",
        "apply_chat_template",
    }
)
_COLLATE = re.compile(r"collat", re.IGNORECASE)
_DATA_FILE = re.compile(
    r"torch/utils/data/|(^|/)datasets/|webdataset|(^|/)dali/|petastorm|streaming/base|(^|/)ffcv/",
    re.IGNORECASE,
)
_DATA_FUNC = re.compile(r"dataloader|_worker_loop|get_batch|load_batch|next_batch", re.IGNORECASE)
_DATA_GETITEM = frozenset({"__getitem__", "__getitems__"})
# Top-level packages whose frames count as framework code when py-spy shortens their path.
_FRAMEWORK_PACKAGES = frozenset(
    (  # noqa: SIM905 (one word list reads better than 37 lines of literals)
        "torch torchvision torchaudio transformers accelerate deepspeed megatron apex numpy triton "
        "flash_attn xformers lightning pytorch_lightning jax jaxlib flax optax tensorflow keras safetensors "
        "einops timm vllm peft bitsandbytes fairscale tqdm wandb PIL scipy pandas sklearn cupy numba "
        "onnxruntime tensorrt"
    ).split()
)
_STDLIB = frozenset(sys.stdlib_module_names)


def frame_class(frame: Frame) -> str:
    """Class of one frame on its own: tokenization, collate, data_loading, framework, stdlib or user_code
    ("thread"/"process" for py-spy's synthetic frames)."""
    path = frame.file.replace("\\", "/")
    func = frame.func
    if frame.kind != "python":
        return frame.kind
    if _TOKENIZE.search(func) or _TOKENIZE.search(path):
        return "tokenization"
    if func in _TOKENIZE_FUNCS and not re.search(r"(^|/)(json|codecs|base64|email|encodings)/", path):
        return "tokenization"
    if _COLLATE.search(func) or _COLLATE.search(path):
        return "collate"
    if _DATA_FILE.search(path) or _DATA_FUNC.search(func):
        return "data_loading"
    if func in _DATA_GETITEM and re.search(r"data", path, re.IGNORECASE):
        return "data_loading"
    return _library_class(path)


def _library_class(path: str) -> str:
    if not path or path.startswith("<string>"):
        return "user_code"
    if path.startswith("<frozen") or path.startswith("<built-in"):
        return "stdlib"
    if "site-packages/" in path or "dist-packages/" in path or path.endswith((".so", ".dylib", ".dll")):
        return "framework"
    if re.search(r"/lib/python\d+(?:\.\d+)?t?/", path):
        return "stdlib"
    top = path.lstrip("./").split("/", 1)[0].removesuffix(".py")
    if "/" in path and not path.startswith("/") and top in _FRAMEWORK_PACKAGES:
        return "framework"  # py-spy's short file names are relative to sys.path
    if top in _STDLIB and not path.startswith("/"):
        return "stdlib"
    return "user_code"


def _sample_class(stack: tuple[Frame, ...], cache: dict[Frame, str]) -> str:
    """A sample belongs to the input pipeline if any frame on its stack does (most specific wins);
    otherwise to whoever owns the leaf frame (framework, stdlib or user code)."""
    classes = set()
    leaf_class = "user_code"
    for frame in stack:
        if frame.kind != "python":
            continue
        cls = cache.get(frame)
        if cls is None:
            cls = cache[frame] = frame_class(frame)
        classes.add(cls)
        leaf_class = cls
    for cls in ("tokenization", "collate", "data_loading"):
        if cls in classes:
            return cls
    return leaf_class if leaf_class in ("framework", "stdlib", "user_code") else "user_code"


def _icicle(profile: Profile, max_nodes: int) -> dict[str, Any]:
    # Build the full tree (node = path of merged frame keys), then keep the heaviest nodes. A child never
    # outweighs its parent, so ordering by (-value, depth) keeps every kept node's parent.
    key_id: dict[Frame, int] = {}
    merged: dict[tuple[str, str, str], int] = {}
    for stack in profile.stacks:
        for frame in stack:
            if frame not in key_id:
                key_id[frame] = merged.setdefault(frame.key, len(merged))
    value, depth, parent, frame_of = _tree(profile, key_id)
    total = len(value)
    value_a, parent_a = value, parent
    order = np.lexsort((np.arange(total), depth, -value_a))
    child_count = np.bincount(parent_a[1:], minlength=total)
    child_value = np.bincount(parent_a[1:], weights=value_a[1:], minlength=total)
    budget = max(2, max_nodes)
    keep = min(budget, total)
    while True:
        kept = order[:keep]
        kept_children = kept[kept != 0]
        kept_count = np.bincount(parent_a[kept_children], minlength=total)
        partial = kept[child_count[kept] > kept_count[kept]]
        # Each "other" node hangs under a kept node, so keeping half the budget always fits.
        if keep + partial.size <= budget or keep <= budget // 2:
            break
        keep = max(budget // 2, budget - int(partial.size))
    kept_value = np.bincount(parent_a[kept_children], weights=value_a[kept_children], minlength=total)
    ids, labels, parents, values, classes = [], [], [], [], []
    cache: dict[Frame, str] = {}
    for n in sorted(kept.tolist(), key=lambda n: (depth[n], n)):
        frame = frame_of[n]
        ids.append(f"n{n}")
        labels.append("all" if frame is None else frame.label())
        parents.append("" if n == 0 else f"n{parent[n]}")
        values.append(round(float(value[n]), 6))
        classes.append("" if frame is None else cache.setdefault(frame, frame_class(frame)))
    for n in sorted(partial.tolist()):
        ids.append(f"n{n}-other")
        labels.append("other")
        parents.append(f"n{n}")
        values.append(round(float(child_value[n] - kept_value[n]), 6))
        classes.append("other")
    return {
        "ids": ids,
        "labels": labels,
        "parents": parents,
        "values": values,
        "classes": classes,
        "branchvalues": "total",
        "total_nodes": total,
        "kept_nodes": int(kept.size),
    }


def _tree(
    profile: Profile, key_id: dict[Frame, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Frame | None]]:
    """The call tree of every stack: value, depth and parent per node, and a frame per node (None: root).

    Nodes are numbered as building the tree stack by stack in file order would number them (by the
    first stack through a node, then depth), but the tree is built from the stacks in sorted order:
    a stack then shares its path with the previous one up to their common prefix, so no dict from edges
    to nodes is needed (it took ~100 bytes per node, 3.7x the file on a 20 MB profile).
    """
    items = list(profile.stacks.items())
    paths = [tuple(map(key_id.__getitem__, stack)) for stack, _ in items]
    order = sorted(range(len(items)), key=paths.__getitem__)
    value, depth, parent, first = array("d", [0.0]), array("q", [0]), array("q", [0]), array("q", [-1])
    frame_of: list[Frame | None] = [None]
    on_path: list[int] = []  # nodes of the previous stack's path, root excluded
    previous: tuple[int, ...] = ()
    for index in order:
        checkpoint()
        path = paths[index]
        stack, weight = items[index]
        shared = 0
        limit = min(len(path), len(previous))
        while shared < limit and path[shared] == previous[shared]:
            shared += 1
        del on_path[shared:]
        value[0] += weight
        for node in on_path:
            value[node] += weight
            if index < first[node]:
                first[node] = index
        node = on_path[-1] if on_path else 0
        for level in range(shared, len(path)):
            child = len(value)
            value.append(weight)
            depth.append(level + 1)
            parent.append(node)
            first.append(index)
            frame_of.append(stack[level])
            on_path.append(child)
            node = child
        previous = path
    del paths, order, items
    depth_a = np.frombuffer(depth, dtype=np.int64)
    # Old number of each node: by the first stack through it, then depth (unique along one path).
    by_first = np.lexsort((depth_a, np.frombuffer(first, dtype=np.int64)))
    renumber = np.empty(len(by_first), dtype=np.int64)
    renumber[by_first] = np.arange(len(by_first))
    value_out = np.frombuffer(value, dtype=np.float64)[by_first]
    depth_out = depth_a[by_first]
    parent_out = renumber[np.frombuffer(parent, dtype=np.int64)[by_first]]
    del value, depth, parent, first
    frames = [frame_of[i] for i in by_first.tolist()]
    return value_out, depth_out, parent_out, frames


_K = TypeVar("_K", bound=Hashable)


def _most_common(weights: Mapping[_K, float], n: int) -> list[tuple[_K, float]]:
    """The n heaviest entries, heaviest first (what Counter.most_common(n) does)."""
    return heapq.nlargest(n, weights.items(), key=itemgetter(1))


def _hot_frames(profile: Profile, total: float, top_n: int, cache: dict[Frame, str]) -> dict[str, Any]:
    # Float weights (seconds or samples), so defaultdict(float) rather than Counter (int-valued in typeshed).
    self_w: defaultdict[tuple[str, str, str], float] = defaultdict(float)
    incl_w: defaultdict[tuple[str, str, str], float] = defaultdict(float)
    example: dict[tuple[str, str, str], Frame] = {}
    for stack, weight in profile.stacks.items():
        python = [f for f in stack if f.kind == "python"]
        if not python:
            continue
        self_w[python[-1].key] += weight
        for frame in python:
            example.setdefault(frame.key, frame)
        for key in {f.key for f in python}:  # recursion counts once per sample
            incl_w[key] += weight

    def row(key: tuple[str, str, str]) -> dict[str, Any]:
        frame = example[key]
        return {
            "function": frame.func,
            "file": frame.file,
            "label": frame.label(),
            "class": cache.setdefault(frame, frame_class(frame)),
            "self_pct": round(100.0 * self_w.get(key, 0.0) / total, 3),
            "inclusive_pct": round(100.0 * incl_w.get(key, 0.0) / total, 3),
        }

    return {
        "hot_self": [row(k) for k, _ in _most_common(self_w, top_n)],
        "hot_inclusive": [row(k) for k, _ in _most_common(incl_w, top_n)],
        "distinct_functions": len(incl_w),
    }


_PROCESS_PARTS = re.compile(r'^process (\d+):"(.*)"$', re.DOTALL)


def processes_of(profile: Profile) -> dict[str, list[Any]]:
    """{"pids": [...], "commands": [...]} from py-spy's synthetic ``process PID:"command"`` frames
    (written with --subprocesses; empty lists without them)."""
    seen: dict[int, str] = {}
    for stack in profile.stacks:
        for frame in stack:
            if frame.kind == "process" and (m := _PROCESS_PARTS.match(frame.func)):
                seen.setdefault(int(m.group(1)), m.group(2))
    return {"pids": sorted(seen), "commands": list(dict.fromkeys(seen.values()))}


@guarded("py-spy profile")
def analyze_pyspy(
    source: bytes | str | Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    filename: str | None = None,
    max_nodes: int = MAX_NODES,
    top_n: int = 30,
) -> dict[str, Any]:
    """Analyse a py-spy raw or speedscope profile.

    Returns totals, per-thread shares, class shares in % of samples (data_loading, tokenization,
    collate, framework, stdlib, user_code; `input_pipeline_pct` sums the first three), hot frames by
    self and inclusive share, and an icicle tree (ids/labels/parents/values, at most `max_nodes` nodes,
    the rest of each parent's children folded into one "other" node), and the `capture` block
    (`jobs.profiling.capture`: all unknown, py-spy records no time).
    """
    profile = parse_pyspy(source, max_bytes=max_bytes, filename=filename)
    total = sum(profile.stacks.values())
    if total <= 0:
        raise ArtifactError("The profile's samples all have zero weight.")
    cache: dict[Frame, str] = {}
    class_w: defaultdict[str, float] = defaultdict(float)
    thread_w: defaultdict[str, float] = defaultdict(float)
    for stack, weight in profile.stacks.items():
        class_w[_sample_class(stack, cache)] += weight
        threads = [f.func for f in stack if f.kind == "thread"]
        thread_w[threads[-1] if threads else "(all threads)"] += weight
    classes_pct = {cls: round(100.0 * class_w.get(cls, 0.0) / total, 3) for cls in CLASSES}
    return {
        "format": profile.format,
        "samples": profile.samples,
        "total_weight": round(total, 6),
        "weight_unit": profile.weight_unit,
        "sampled_seconds": round(total, 3) if profile.weight_unit == "seconds" else None,
        "distinct_stacks": len(profile.stacks),
        "skipped_lines": profile.skipped_lines,
        "threads": [
            {"thread": name, "share_pct": round(100.0 * w / total, 3)}
            for name, w in _most_common(thread_w, 50)
        ],
        "classes_pct": classes_pct,
        "input_pipeline_pct": round(sum(classes_pct[c] for c in INPUT_PIPELINE_CLASSES), 3),
        **_hot_frames(profile, total, top_n, cache),
        "icicle": _icicle(profile, max_nodes),
        # py-spy's raw and speedscope outputs record sample counts or weights, never when they were taken
        # or on which GPU: the capture block says so. With --subprocesses its process frames name the
        # pid and command line, which the run check can show and match (jobs.profiling.run_check).
        "capture": make_capture(
            source="py-spy: unknown: py-spy profiles carry no wall-clock time", **processes_of(profile)
        ),
    }
