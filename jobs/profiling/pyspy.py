"""Parse py-spy profiles (raw collapsed stacks, speedscope JSON) into a bounded icicle tree, hot frames
and a classification of where the Python time went (data loading, tokenisation, collate, framework...).

SVG flame graphs are refused: they are pictures with scripts, and their frame widths are rounded.
"""

from __future__ import annotations

import heapq
import io
import math
import re
import sys
import warnings
from array import array
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any, TextIO, TypeVar

import msgspec
import numpy as np

from jobs.profiling.capture import make_capture
from jobs.profiling.detect import DEFAULT_MAX_BYTES, REJECTED_KINDS, SVG, iter_lines, load_bytes, open_text
from jobs.profiling.errors import ArtifactError
from jobs.profiling.guard import checkpoint, guarded

#: Frame names and files are cut to this length; stacks deeper than MAX_DEPTH are refused.
MAX_NAME_CHARS = 1000
MAX_DEPTH = 4096
#: A sample count above this is not py-spy's (10^15 samples at 100 Hz is 300,000 years).
MAX_COUNT = 1e15
CLASSES = ("data_loading", "tokenization", "collate", "framework", "stdlib", "user_code")
INPUT_PIPELINE_CLASSES = ("data_loading", "tokenization", "collate")
MAX_NODES = 2000

_RAW_LINE = re.compile(r"^(.*\S)\s+(\d+(?:\.\d+)?)\s*$")
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_PROCESS = re.compile(r'^process \d+:".*"$', re.DOTALL)
_THREAD = re.compile(r"^thread \((?:0x[0-9A-Fa-f]+|\d+)\)(?::.*)?$")
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


@dataclass(frozen=True, eq=False, slots=True)
class Frame:
    """One frame: function, file and line (0 when unknown); kind is "python", "process" or "thread".

    Frames are interned per profile, so identity comparison and hashing (fast) are enough.
    """

    func: str
    file: str
    line: int
    kind: str = "python"

    @property
    def key(self) -> tuple[str, str, str]:
        # Tree nodes and hot frames merge a function's lines, as flame graphs do without --lineno.
        return (self.kind, self.func, self.file)

    def label(self) -> str:
        if self.kind != "python" or not self.file:
            return self.func
        return f"{self.func} ({_short(self.file)})"


@dataclass
class Profile:
    """Aggregated stacks (root first) with their weight, and what the weight means."""

    format: str
    stacks: dict[tuple[Frame, ...], float]
    samples: int
    weight_unit: str  # "samples" or "seconds"
    skipped_lines: int = 0


def _short(path: str) -> str:
    if not path.startswith("/") and not re.match(r"^[A-Za-z]:[\\/]", path):
        return path  # already py-spy's short name, relative to sys.path
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    if m := re.search(r"/lib/python\d+(?:\.\d+)?t?/(.*)$", path):
        return m.group(1)
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:]) if len(parts) > 2 else path


def _parse_frame(text: str, names: dict[str, str] | None = None) -> Frame:
    if _PROCESS.match(text):
        return Frame(text, "", 0, "process")
    if _THREAD.match(text):
        return Frame(text, "", 0, "thread")
    if m := _FRAME.match(text):
        func, file = m.group("func"), m.group("file")
        if names is not None:  # one string per distinct function and file, not one per line number
            func, file = names.setdefault(func, func), names.setdefault(file, file)
        return Frame(func, file, int(m.group("line") or 0))
    return Frame(text, "", 0)


def parse_pyspy_raw(text: str | Iterable[str]) -> Profile:
    """Parse `py-spy record --format raw` output: one `frame;frame;...;leaf COUNT` line per stack.

    `text` is the whole output or its lines. A line whose count is not a believable sample count
    (10^23, a number past float range) is skipped like any malformed line.
    """
    stacks: defaultdict[tuple[Frame, ...], float] = defaultdict(float)
    frames: dict[str, Frame] = {}
    names: dict[str, str] = {}
    bad = good = 0
    for line in text.splitlines() if isinstance(text, str) else text:
        if not line.strip():
            continue
        checkpoint()
        m = _RAW_LINE.match(line)
        if m is None or not m.group(1).strip():
            bad += 1
            continue
        count = float(m.group(2)) if len(m.group(2)) <= 32 else math.inf
        if not count <= MAX_COUNT:
            bad += 1
            continue
        parts = m.group(1).split(";")
        if len(parts) > MAX_DEPTH:
            bad += 1
            continue
        good += 1
        stack = []
        for part in parts:
            frame = frames.get(part)
            if frame is None:
                frame = frames[part] = _parse_frame(part[:MAX_NAME_CHARS], names)
            stack.append(frame)
        stacks[tuple(stack)] += count
    if good == 0 or bad > good:
        raise ArtifactError(
            "This is not py-spy raw output: expected lines like "
            "'main (train.py:10);step (train.py:42) 17' (a stack and a sample count)."
        )
    total = sum(stacks.values())
    return Profile("pyspy_raw", dict(stacks), int(total), "samples", skipped_lines=bad)


class _SpeedscopeProfile(msgspec.Struct):
    # `samples` and `weights` stay raw JSON text: they are most of the file, and Python lists of ints
    # and floats would take ~10x its size. `_sampled_stacks` reads them without building those lists.
    type: Any = None
    name: Any = None
    unit: Any = None
    samples: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))
    weights: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))
    events: Any = None


class _SpeedscopeDocument(msgspec.Struct):
    profiles: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))
    shared: Any = None


_PROFILES = msgspec.json.Decoder(list[msgspec.Raw])
_PROFILE = msgspec.json.Decoder(_SpeedscopeProfile)
_DOCUMENT = msgspec.json.Decoder(_SpeedscopeDocument)
_SAMPLE = re.compile(rb"\[([-\d,\s]*)\]")
_SAMPLE_GAP = re.compile(rb"\s*,?\s*")


def _json_error(exc: Exception) -> ArtifactError:
    return ArtifactError(f"The speedscope file is not valid JSON: {exc}.")


def parse_speedscope(data: bytes) -> Profile:
    """Parse a speedscope JSON file (sampled profiles; evented profiles are converted to durations)."""
    try:
        doc = _DOCUMENT.decode(data)
    except msgspec.ValidationError:
        raise ArtifactError("The speedscope file has no 'profiles' list.") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise _json_error(exc) from exc
    try:
        profiles = _PROFILES.decode(doc.profiles)
    except msgspec.ValidationError:
        raise ArtifactError("The speedscope file has no 'profiles' list.") from None
    raw_frames = doc.shared.get("frames") if isinstance(doc.shared, dict) else None
    if not isinstance(raw_frames, list):
        raise ArtifactError("The speedscope file has no 'shared.frames' list.")
    frames = []
    for item in raw_frames:
        if not isinstance(item, dict):
            raise ArtifactError("A speedscope frame is not an object.")
        line = item.get("line")
        frames.append(
            Frame(
                str(item.get("name", "?"))[:MAX_NAME_CHARS],
                str(item.get("file") or "")[:MAX_NAME_CHARS],
                line if isinstance(line, int) and 0 <= line < 2**31 else 0,
            )
        )
    stacks: defaultdict[tuple[Frame, ...], float] = defaultdict(float)
    samples = 0
    units = set()
    for number, raw_profile in enumerate(profiles):
        try:
            profile = _PROFILE.decode(raw_profile)
        except msgspec.ValidationError:
            raise ArtifactError(f"Profile {number} of the speedscope file is not an object.") from None
        thread = Frame(str(profile.name or f"profile {number}")[:MAX_NAME_CHARS], "", 0, "thread")
        units.add(str(profile.unit if profile.unit is not None else "none")[:50])
        if profile.type == "evented":
            samples += _add_evented({"events": profile.events}, frames, thread, stacks)
        else:
            samples += _add_sampled(profile, frames, thread, stacks, number)
    if not stacks:
        raise ArtifactError("The speedscope file holds no samples.")
    unit = "seconds" if units == {"seconds"} else "samples" if units <= {"none"} else "/".join(sorted(units))
    return Profile("pyspy_speedscope", dict(stacks), samples, unit)


def _frame_at(frames: list[Frame], index: Any) -> Frame:
    if not isinstance(index, int) or not 0 <= index < len(frames):
        raise ArtifactError(f"The speedscope file refers to frame {index!r}, which does not exist.")
    return frames[index]


def _weights(raw: msgspec.Raw, number: int) -> np.ndarray | None:
    """The weights as float64, or None when the list is not a plain list of numbers."""
    text = bytes(raw).strip()
    if not (text.startswith(b"[") and text.endswith(b"]")):
        return None
    inner = text[1:-1]
    expected = inner.count(b",") + 1 if inner.strip() else 0
    if expected == 0:
        return np.zeros(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            values = np.fromstring(inner, dtype=np.float64, sep=",")
        except ValueError:
            return None
    return values if values.size == expected else None


def _add_sampled(
    profile: _SpeedscopeProfile,
    frames: list[Frame],
    thread: Frame,
    stacks: defaultdict[tuple[Frame, ...], float],
    number: int,
) -> int:
    bad_shape = ArtifactError(
        f"Profile {number} of the speedscope file needs 'samples' and 'weights' of equal length."
    )
    weights = _weights(profile.weights, number)
    fast = _fast_samples(profile.samples) if weights is not None else None
    if fast is None or weights is None:
        return _add_sampled_slowly(profile, frames, thread, stacks, number)
    if len(fast) != weights.size:
        raise bad_shape
    if not np.all(np.isfinite(weights)):
        raise ArtifactError(f"Profile {number} of the speedscope file has a weight that is not a number.")
    cache: dict[bytes, tuple[Frame, ...]] = {}
    for key, weight in zip(fast, weights.tolist(), strict=True):
        stack = cache.get(key)
        if stack is None:
            indexes = [int(i) for i in key.split(b",") if i.strip()]
            if len(indexes) > MAX_DEPTH:
                raise ArtifactError(
                    f"Profile {number} of the speedscope file has a stack deeper than {MAX_DEPTH}."
                )
            stack = cache[key] = (thread, *(_frame_at(frames, i) for i in indexes))
        stacks[stack] += weight
        checkpoint()
    return len(fast)


def _fast_samples(raw: msgspec.Raw) -> list[bytes] | None:
    """Each sample's index list as raw text (b"0,1,2"), or None when the samples are not all plain
    lists of integers (the slow path then reports what is wrong)."""
    text = bytes(raw).strip()
    if not (text.startswith(b"[") and text.endswith(b"]")):
        return None
    inner = text[1:-1]
    out: list[bytes] = []
    pos = 0
    gap = _SAMPLE_GAP
    for m in _SAMPLE.finditer(inner):
        between = gap.fullmatch(inner, pos, m.start())
        if between is None or (out and b"," not in inner[pos : m.start()]):
            return None
        out.append(m.group(1))
        pos = m.end()
    if inner[pos:].strip():
        return None
    return out


def _add_sampled_slowly(
    profile: _SpeedscopeProfile,
    frames: list[Frame],
    thread: Frame,
    stacks: defaultdict[tuple[Frame, ...], float],
    number: int,
) -> int:
    try:
        samples = msgspec.json.decode(profile.samples)
        weights = msgspec.json.decode(profile.weights)
    except msgspec.DecodeError as exc:
        raise _json_error(exc) from exc
    if not isinstance(samples, list) or not isinstance(weights, list) or len(samples) != len(weights):
        raise ArtifactError(
            f"Profile {number} of the speedscope file needs 'samples' and 'weights' of equal length."
        )
    cache: dict[tuple[int, ...], tuple[Frame, ...]] = {}
    for sample, weight in zip(samples, weights, strict=True):
        if (
            not isinstance(sample, list)
            or not isinstance(weight, int | float)
            or isinstance(weight, bool)
            or not all(isinstance(i, int) for i in sample)
        ):
            raise ArtifactError(f"Profile {number} of the speedscope file has a malformed sample.")
        try:
            value = float(weight)
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            raise ArtifactError(f"Profile {number} of the speedscope file has a weight that is not a number.")
        key = tuple(sample)
        stack = cache.get(key)
        if stack is None:
            stack = cache[key] = (thread, *(_frame_at(frames, i) for i in sample))
        stacks[stack] += value
        checkpoint()
    return len(samples)


def _add_evented(
    profile: dict[str, Any], frames: list[Frame], thread: Frame, stacks: defaultdict[tuple[Frame, ...], float]
) -> int:
    events = profile.get("events")
    if not isinstance(events, list):
        raise ArtifactError("An evented speedscope profile has no 'events' list.")
    open_frames: list[Frame] = []
    last_at: float | None = None
    count = 0
    for event in events:
        if not isinstance(event, dict) or not isinstance(event.get("at"), int | float):
            raise ArtifactError("An evented speedscope profile has a malformed event.")
        at = float(event["at"])
        if open_frames and last_at is not None and at > last_at:
            stacks[(thread, *open_frames)] += at - last_at
            count += 1
        last_at = at
        frame = _frame_at(frames, event.get("frame"))
        if event.get("type") == "O":
            open_frames.append(frame)
        elif event.get("type") == "C" and open_frames:
            open_frames.pop()
    return count


@guarded("py-spy profile", storable=False)
def parse_pyspy(
    source: bytes | str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES, filename: str | None = None
) -> Profile:
    """Parse a py-spy raw or speedscope file (chosen by content). SVG flame graphs raise ArtifactError."""
    with open_text(source, max_bytes, what="py-spy profile") as text:
        head = text.read(2048)
        lowered = head.lstrip().lower()
        if lowered.startswith(("<?xml", "<svg", "<!doctype svg")) or (filename or "").lower().endswith(
            ".svg"
        ):
            raise ArtifactError(REJECTED_KINDS[SVG])
        if not lowered.startswith(("{", "[")):
            return parse_pyspy_raw(iter_lines(_Prepend(head, text)))  # type: ignore[arg-type]
    # speedscope JSON: msgspec decodes from the bytes without building the samples as Python lists.
    return parse_speedscope(load_bytes(source, max_bytes, what="py-spy profile"))


class _Prepend(io.TextIOBase):
    """A text stream that first returns `head` (already read for sniffing), then the rest of `rest`."""

    def __init__(self, head: str, rest: TextIO) -> None:
        super().__init__()
        self._head = io.StringIO(head)
        self._rest = rest
        self._head_done = False

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        limit = -1 if size is None else size
        if not self._head_done:
            line = self._head.readline(limit)
            if line.endswith(("\n", "\r")) or (limit > 0 and len(line) >= limit):
                return line
            self._head_done = True
            more = self._rest.readline(-1 if limit < 0 else limit - len(line))
            return line + more
        return self._rest.readline(limit)


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
