"""Parse PyTorch profiler (Kineto) Chrome-trace JSON, plain or gzipped, into the columnar event model.

Handles the current schema (``cat`` kernel/gpu_memcpy/cuda_runtime/..., ``deviceProperties``,
``distributedInfo``, ``baseTimeNanoseconds``, float microsecond timestamps with nanosecond digits), the
2021 schema (``cat`` Kernel/Memcpy/Runtime/Operator, ``computeProperties``, string tids such as
"stream 7", flows with cat "async"), ROCm traces (HIP runtime calls under cat cuda_runtime), CPU-only
traces and traces without distributedInfo. Flow events (ac2g, async_cpu_to_gpu, async) are not needed:
GPU ops and the runtime calls that launched them join on ``args.correlation`` in every schema.

Uploads are untrusted: decompression is bounded by `max_decompressed_bytes` and the JSON is decoded
against a typed schema (msgspec), so a malformed file fails with one `ArtifactError` that says what and
where, never with a stack trace from deep inside an analysis.

Why msgspec rather than orjson: decoding into typed structs skips every field we do not need (input
shapes, call stacks, memory events' args) while parsing. On the 54 MB V100 sample trace orjson peaks at
~820 MB of Python dicts; the typed decode peaks at ~105 MB and is faster (0.26 s vs 0.46 s).
"""

from __future__ import annotations

import functools
import mmap
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from jobs.profiling.errors import ArtifactError
from jobs.profiling.events import (
    Trace,
)
from jobs.profiling.guard import check_now, grow_input, guarded
from jobs.profiling.kineto_columns import _TraceBuilder
from jobs.profiling.kineto_schema import (
    _DECODER,
    _FAST_DOC_DECODER,
    _FAST_LIST_DECODER,
    _LENIENT_DOC_DECODER,
    _LENIENT_LIST_DECODER,
    _Complete,
    _Document,
    _Event,
)
from jobs.profiling.trace_io import (
    DEFAULT_MAX_DECOMPRESSED_BYTES,
    map_plain_file,
    pieces_of_buffer,
    pieces_of_path,
    read_trace_bytes,
)

__all__ = ["DEFAULT_MAX_DECOMPRESSED_BYTES", "parse_kineto", "parse_kineto_json", "read_trace_bytes"]


@guarded("Kineto trace", storable=False)
def parse_kineto(
    source: bytes | bytearray | str | Path | BinaryIO,
    *,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    rank: int | None = None,
) -> Trace:
    """Parse one Kineto trace (one rank) from a path, bytes or binary file object.

    `rank` overrides the rank when distributedInfo is missing or wrong (e.g. from the file name).
    Raises `ArtifactError` for anything that is not a readable Kineto trace.

    The JSON is streamed: read (and gunzipped) piece by piece, cut between events into chunks of a few
    MiB, each chunk decoded and turned into columns before the next is read, so neither the whole text
    nor a list of every event is ever in memory. A file the chunking cannot follow (no top-level
    traceEvents array, an unusual phase, invalid JSON) is decoded whole instead, which also gives the
    error message for a broken file.
    """
    opener: Callable[[], Iterator[bytes | bytearray | memoryview]]
    streamed: Trace | None
    if isinstance(source, str | Path):
        opener = functools.partial(pieces_of_path, Path(source), max_decompressed_bytes)
        mapped = map_plain_file(Path(source), max_decompressed_bytes)
        # A mapped file is decoded where it lies; its fallback reads the file again (the mapping's
        # bytes were changed in place), as gzip and unmappable files are read from the start.
        streamed = _parse_mapped(mapped, rank) if mapped is not None else _parse_streamed(opener(), rank)
    else:
        # A file object can be read once only, and the whole-file fallback needs a second read.
        buffer = (
            source
            if isinstance(source, bytes | bytearray | memoryview)
            else read_trace_bytes(source, max_decompressed_bytes)
        )
        opener = functools.partial(pieces_of_buffer, buffer, max_decompressed_bytes)
        streamed = _parse_streamed(opener(), rank)
    if streamed is not None:
        return streamed
    whole = b"".join(opener())
    size = len(whole)
    grow_input(size)
    builder = _TraceBuilder()
    _decode_whole(whole, builder)
    del whole
    return builder.finish(rank, size)


@guarded("Kineto trace", storable=False)
def parse_kineto_json(data: bytes | bytearray | str, *, rank: int | None = None) -> Trace:
    """Parse already-decompressed Kineto JSON."""
    if isinstance(data, bytes | bytearray):
        streamed = _parse_streamed(iter((data,)), rank)
        if streamed is not None:
            return streamed
    builder = _TraceBuilder()
    _decode_whole(data, builder)
    return builder.finish(rank, len(data))


def _decode_whole(data: bytes | bytearray | str, builder: _TraceBuilder) -> None:
    if not data or not (data.strip() if isinstance(data, str) else bytes(data[:4096]).strip()):
        raise ArtifactError("The trace is empty.")
    try:
        doc = _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise ArtifactError(f"Not a PyTorch profiler (Kineto) trace: {exc}.") from exc
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"The trace is not valid JSON: {exc}.") from exc
    if isinstance(doc, list):
        # Chrome's "JSON array format": events only, no metadata.
        builder.add([ev for ev in doc if ev.ph == "X"])
        builder.meta = _Document()
        return
    if doc.traceEvents is None:
        raise ArtifactError(
            "The JSON has no traceEvents array, so it is not a PyTorch profiler (Kineto) trace."
        )
    events = doc.traceEvents
    doc.traceEvents = None
    builder.add([ev for ev in events if ev.ph == "X"])
    builder.meta = doc


# -- streaming ---------------------------------------------------------------------------------------

#: Decoded chunk size: big enough that per-chunk overhead vanishes, small enough that one chunk's
#: decoded events (about the size of its text) are a small share of the peak.
_STREAM_CHUNK = 4 << 20
_TRACE_EVENTS_KEY_RE = re.compile(rb'"traceEvents"\s*:\s*\[')
#: Between two events of the traceEvents array. A match inside a string or a nested value is harmless:
#: both halves then fail to decode (unbalanced brackets or an unterminated string) and the whole file is
#: decoded instead, so a wrong cut can never produce wrong events.
_EVENT_BOUNDARY_RE = re.compile(rb"\}\s*,\s*\{")
_LEADING_WS_RE = re.compile(rb"\s*")
#: The document's keys before traceEvents (deviceProperties, distributedInfo) are small; a prefix this
#: long without the array is not a Kineto layout the stream can follow.
_MAX_HEAD = 64 << 20


class _NotStreamable(Exception):
    """The chunked reading cannot follow this file; decode it whole."""


_STREAM_FAILURES = (_NotStreamable, msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError)


def _parse_streamed(pieces: Iterator[bytes | bytearray | memoryview], rank: int | None) -> Trace | None:
    """The trace from chunked decoding, or None when the file must be decoded whole."""
    builder = _TraceBuilder()
    try:
        size = _stream_events(pieces, builder)
    except _STREAM_FAILURES:
        return None
    finally:
        close = getattr(pieces, "close", None)
        if close is not None:
            close()
    return builder.finish(rank, size)


def _parse_mapped(mapped: mmap.mmap, rank: int | None) -> Trace | None:
    """`_parse_streamed` over a mapped plain file (closed here), or None when it must be decoded whole."""
    builder = _TraceBuilder()
    try:
        size = _stream_mapped(mapped, builder)
    except _STREAM_FAILURES:
        return None
    finally:
        mapped.close()
    return builder.finish(rank, size)


def _decode_chunk(
    text: bytes | bytearray | memoryview, fast: msgspec.json.Decoder, lenient: msgspec.json.Decoder
) -> Any:
    try:
        return fast.decode(text)
    except msgspec.ValidationError:
        # A phase outside the Chrome format or a non-string ph: the lenient schema reads it (and skips it).
        return lenient.decode(text)


def _x_events(events: list[Any]) -> list[Any]:
    """The complete events of a decoded chunk (fast decoder: `_Complete` structs; lenient: ph "X")."""
    if events and type(events[0]) is _Event:
        return [ev for ev in events if ev.ph == "X"]
    return list(filter(_IS_COMPLETE, events))  # a C-level type test per event


_IS_COMPLETE = _Complete.__instancecheck__  # _Complete has no subclasses: this is `type(ev) is _Complete`


def _find_head(buf: bytearray | mmap.mmap, end: int) -> tuple[bytes, int, bool] | None:
    """Where the events start in buf[:end]: (the document's text before the traceEvents array, the
    position after the '[' that opens it, whether the document is a bare array), or None while the
    opening '[' may still come in later bytes."""
    first = _LEADING_WS_RE.match(buf, 0, end).end()  # type: ignore[union-attr]
    if first < end and buf[first : first + 1] == b"[":
        return b"", first + 1, True  # Chrome's JSON array format: the array is the document
    m = _TRACE_EVENTS_KEY_RE.search(buf, 0, end)
    if m is None:
        return None
    head = bytes(buf[: m.end() - 1])
    # The key must be the top-level one: the head plus an empty array must close as a document.
    try:
        probe = _LENIENT_DOC_DECODER.decode(head + b"[]}")
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise _NotStreamable from exc
    if probe.traceEvents != []:
        raise _NotStreamable
    return head, m.end(), False


def _decode_cut(buf: bytearray | mmap.mmap, pos: int, cut: re.Match[bytes], builder: _TraceBuilder) -> None:
    """Decode the events from `pos` to the boundary `cut` into builder.

    In place, without copying the chunk: the byte before its first event ('[' or a separator) becomes
    '[' and the one after its last '}' (a separator) becomes ']'. Both are whitespace or the comma
    between two events, consumed by this cut.
    """
    end = cut.start() + 1
    buf[pos - 1] = 0x5B  # [
    buf[end] = 0x5D  # ]
    view = memoryview(buf)
    part = view[pos - 1 : end + 1]
    try:
        events = _decode_chunk(part, _FAST_LIST_DECODER, _LENIENT_LIST_DECODER)
    finally:
        part.release()
        view.release()
    builder.add(_x_events(events))


def _decode_tail(
    head: bytes, tail: bytes | bytearray | memoryview, list_mode: bool, builder: _TraceBuilder
) -> None:
    """The last chunk: it closes the array and carries the keys after it (traceName,
    baseTimeNanoseconds)."""
    if not list_mode and _TRACE_EVENTS_KEY_RE.search(tail) is not None:
        raise _NotStreamable  # a second traceEvents key: let the whole-file decoder decide
    last = bytearray(head)
    last += b"["
    last += tail
    if list_mode:
        builder.add(_x_events(_decode_chunk(last, _FAST_LIST_DECODER, _LENIENT_LIST_DECODER)))
        builder.meta = _Document()
        return
    doc = _decode_chunk(last, _FAST_DOC_DECODER, _LENIENT_DOC_DECODER)
    del last
    if doc.traceEvents is None:
        raise _NotStreamable
    builder.add(_x_events(doc.traceEvents))
    doc.traceEvents = None
    builder.meta = doc


def _stream_events(pieces: Iterator[bytes | bytearray | memoryview], builder: _TraceBuilder) -> int:
    """Decode the trace chunk by chunk into `builder`; returns the JSON's size in bytes."""
    buf = bytearray()
    total = 0
    exhausted = False

    def more() -> bool:
        nonlocal total, exhausted
        piece = next(pieces, None)
        if piece is None:
            exhausted = True
            return False
        buf.extend(piece)
        total += len(piece)
        grow_input(total)
        return True

    # The head: everything up to and including the '[' that opens traceEvents.
    while (found := _find_head(buf, len(buf))) is None:
        if len(buf) > _MAX_HEAD or not more():
            raise _NotStreamable
    head, pos, list_mode = found  # pos: start of the undecoded events in buf
    while True:
        check_now()
        cut = None
        if len(buf) - pos > _STREAM_CHUNK:
            cut = _EVENT_BOUNDARY_RE.search(buf, pos + _STREAM_CHUNK)
        if cut is None:
            if not exhausted and more():
                continue
            break
        _decode_cut(buf, pos, cut, builder)
        # Keep the separator byte before the next event's '{' as its '['; deleting a prefix is O(1).
        del buf[: cut.end() - 2]
        pos = 1
    tail = memoryview(buf)[pos:]
    try:
        _decode_tail(head, tail, list_mode, builder)
    finally:
        tail.release()
    buf.clear()
    return total


def _stream_mapped(mapped: mmap.mmap, builder: _TraceBuilder) -> int:
    """`_stream_events` over a whole mapped file: the same chunks, cut at the same boundaries, decoded
    where they lie. Pages behind the decoded chunks are dropped (MADV_DONTNEED) as the decode moves on,
    so the mapping's share of the resident memory stays about one chunk, as the read buffer's was."""
    total = len(mapped)
    grow_input(total)
    found = _find_head(mapped, min(total, _MAX_HEAD + 1))
    if found is None:
        raise _NotStreamable
    head, pos, list_mode = found
    if hasattr(mmap, "MADV_SEQUENTIAL"):
        mapped.madvise(mmap.MADV_SEQUENTIAL)
    released = 0
    while True:
        check_now()
        cut = None
        if total - pos > _STREAM_CHUNK:
            cut = _EVENT_BOUNDARY_RE.search(mapped, pos + _STREAM_CHUNK)
        if cut is None:
            break
        _decode_cut(mapped, pos, cut, builder)
        pos = cut.end() - 1
        # Whole pages before the next chunk. Dropping a private page reverts it to the file's bytes, which
        # is harmless: each chunk's brackets are written right before it is decoded.
        drop = (pos - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        if drop > released and hasattr(mmap, "MADV_DONTNEED"):
            mapped.madvise(mmap.MADV_DONTNEED, released, drop - released)
            released = drop
    tail = memoryview(mapped)[pos:]
    try:
        _decode_tail(head, tail, list_mode, builder)
    finally:
        tail.release()
    return total
