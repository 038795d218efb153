"""Read py-spy profiles -- raw collapsed stacks (``py-spy record --format raw``) and speedscope JSON
(``--format speedscope``) -- into aggregated stacks of interned frames (`Profile`).

`pyspy` classifies the stacks and builds the icicle tree and hot frames from a `Profile`. SVG flame graphs
are refused: they are pictures with scripts, and their frame widths are rounded.
"""

from __future__ import annotations

import io
import math
import re
import warnings
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import msgspec
import numpy as np

from jobs.profiling.detect import DEFAULT_MAX_BYTES, REJECTED_KINDS, SVG, iter_lines, load_bytes, open_text
from jobs.profiling.errors import ArtifactError
from jobs.profiling.guard import checkpoint, guarded

#: Frame names and files are cut to this length; stacks deeper than MAX_DEPTH are refused.
MAX_NAME_CHARS = 1000


MAX_DEPTH = 4096


#: A sample count above this is not py-spy's (10^15 samples at 100 Hz is 300,000 years).
MAX_COUNT = 1e15


_RAW_LINE = re.compile(r"^(.*\S)\s+(\d+(?:\.\d+)?)\s*$")


_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


_PROCESS = re.compile(r'^process \d+:".*"$', re.DOTALL)


_THREAD = re.compile(r"^thread \((?:0x[0-9A-Fa-f]+|\d+)\)(?::.*)?$")


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
