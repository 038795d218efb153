"""Reading an uploaded trace's bytes within a bound: whole (`read_trace_bytes`) or as pieces for the streamed
Kineto decoder (`pieces_of_path`, `pieces_of_buffer`), gunzipped when the magic bytes say gzip (several
members allowed, trailing zero padding tolerated), refusing more than the decompressed limit one chunk past
it (a gzip bomb stops there). Pure: no Django, no trace model; every failure is an `ArtifactError`.
"""

from __future__ import annotations

import io
import mmap
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from jobs.profiling.errors import ArtifactError

#: Default ceiling on the decompressed JSON size.
DEFAULT_MAX_DECOMPRESSED_BYTES = 2 * 1024**3
GZIP_MAGIC = b"\x1f\x8b"
#: Read and decompression step: bounds what one step can allocate past the limit.
READ_CHUNK = 1 << 20
#: Size of the pieces a plain in-memory trace is handed to the streamed decoder in.
PIECE_BYTES = 4 << 20


def read_trace_bytes(
    source: bytes | bytearray | str | Path | BinaryIO,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> bytes | bytearray:
    """The JSON bytes of an upload: gunzipped when gzip, refusing more than `max_decompressed_bytes`.

    Gzip is detected from the magic bytes, not the file name, and may have several members.
    """
    raw = read_source(source, max_decompressed_bytes)
    if raw[:2] != GZIP_MAGIC:
        if len(raw) > max_decompressed_bytes:
            raise ArtifactError(
                f"The trace is {len(raw):,} bytes; the limit is {max_decompressed_bytes:,} bytes."
            )
        return raw
    return gunzip_bounded(raw, max_decompressed_bytes)


def read_source(source: bytes | bytearray | str | Path | BinaryIO, limit: int) -> bytes | bytearray:
    if isinstance(source, bytes | bytearray):
        return source
    if isinstance(source, memoryview):
        return bytes(source)
    try:
        if isinstance(source, str | Path):
            with Path(source).open("rb") as handle:
                return read_stream(handle, limit)
        return read_stream(source, limit)
    except OSError as exc:
        raise ArtifactError(f"The trace file cannot be read: {exc.strerror or exc}.") from exc


def read_stream(handle: BinaryIO | io.BufferedReader, limit: int) -> bytes:
    # Compressed input is smaller than the decompressed limit, and plain JSON must be under it, so
    # reading one byte past the limit is enough to know either way. Chunked: read(limit) would
    # allocate the whole limit up front.
    buf = bytearray()
    while len(buf) <= limit:
        chunk = handle.read(min(READ_CHUNK * 8, limit + 1 - len(buf)))
        if not chunk:
            break
        if not isinstance(chunk, bytes | bytearray):
            raise ArtifactError("The trace source did not return bytes.")
        buf += chunk
    return bytes(buf)


def gunzip_bounded(raw: bytes | bytearray, limit: int) -> bytearray:
    out = bytearray()
    data: bytes = bytes(raw)
    try:
        while True:
            decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
            pending = data
            while not decomp.eof:
                # max_length bounds each step, so a bomb is caught one chunk past the limit.
                chunk = decomp.decompress(pending, READ_CHUNK)
                pending = decomp.unconsumed_tail
                if not chunk and not pending and not decomp.eof:
                    raise ArtifactError("The gzip trace is truncated (the compressed stream ends early).")
                out += chunk
                if len(out) > limit:
                    raise ArtifactError(
                        f"The gzip trace decompresses to more than the limit of {limit:,} bytes "
                        "(a gzip bomb, or a trace too large to analyse)."
                    )
            data = decomp.unused_data
            # Concatenated members are valid gzip; trailing zero padding is tolerated as gzip(1) does.
            if not data.strip(b"\0"):
                break
            if data[:2] != GZIP_MAGIC:
                raise ArtifactError("The gzip trace has trailing garbage after the compressed data.")
    except zlib.error as exc:
        raise ArtifactError(f"The trace is not a valid gzip file: {exc}.") from exc
    return out


def map_plain_file(path: Path, limit: int) -> mmap.mmap | None:
    """A plain (not gzip) trace file mapped copy-on-write, or None when it is gzip, empty or cannot be
    mapped (then read it as pieces). Refuses a file over `limit` as `pieces_of_path` does.

    Mapped, the streamed decoder reads the page cache in place: no 4 MiB read buffer allocated per
    piece and no growing bytearray copied on every extend (together ~0.05 CPU-s of a 100 MB trace,
    a tenth of its parse). Copy-on-write (ACCESS_COPY), so the decoder may write its chunk brackets
    without touching the file. A file truncated by another process while mapped would fault (SIGBUS):
    uploads are our own temporary files and the command line reads the user's own file.
    """
    try:
        with path.open("rb") as handle:
            if handle.read(2) == GZIP_MAGIC:
                return None
            size = handle.seek(0, io.SEEK_END)
            if size > limit:
                raise ArtifactError(f"The trace is {size:,} bytes; the limit is {limit:,} bytes.")
            if size == 0:
                return None
            return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError):  # no such file, a pipe, a file system without mmap: read it instead
        return None


def pieces_of_buffer(
    data: bytes | bytearray | memoryview, limit: int
) -> Iterator[bytes | bytearray | memoryview]:
    view = memoryview(data)
    if view[:2] == GZIP_MAGIC:
        yield from gunzip_pieces(iter((view,)), limit)
        return
    if len(view) > limit:
        raise ArtifactError(f"The trace is {len(view):,} bytes; the limit is {limit:,} bytes.")
    for at in range(0, len(view), PIECE_BYTES):
        yield view[at : at + PIECE_BYTES]


def pieces_of_path(path: Path, limit: int) -> Iterator[bytes | bytearray | memoryview]:
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise ArtifactError(f"The trace file cannot be read: {exc.strerror or exc}.") from exc
    with handle:

        def raw() -> Iterator[bytes]:
            read = 0
            while read <= limit:
                try:
                    piece = handle.read(min(READ_CHUNK * 4, limit + 1 - read))
                except OSError as exc:
                    raise ArtifactError(f"The trace file cannot be read: {exc.strerror or exc}.") from exc
                if not piece:
                    return
                read += len(piece)
                yield piece

        stream = raw()
        first = next(stream, b"")
        if first[:2] == GZIP_MAGIC:
            yield from gunzip_pieces(prepend(first, stream), limit)
            return
        total = 0
        for piece in prepend(first, stream):
            total += len(piece)
            if total > limit:
                raise ArtifactError(f"The trace is {total:,} bytes; the limit is {limit:,} bytes.")
            yield piece


def prepend(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from rest


def gunzip_pieces(compressed: Iterator[bytes | memoryview], limit: int) -> Iterator[bytes]:
    """Decompress gzip (several members allowed) piece by piece, refusing more than `limit` bytes."""
    out_total = 0
    decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
    pending: bytes = b""
    source_done = False
    try:
        while True:
            if not pending and not source_done:
                nxt = next(compressed, None)
                if nxt is None:
                    source_done = True
                else:
                    pending = bytes(nxt)
            if decomp.eof:
                rest = decomp.unused_data + pending
                if not source_done:
                    # Gather the rest to tell another member from trailing padding.
                    rest += b"".join(bytes(p) for p in compressed)
                    source_done = True
                # Concatenated members are valid gzip; trailing zero padding is tolerated as gzip(1) does.
                if not rest.strip(b"\0"):
                    return
                if rest[:2] != GZIP_MAGIC:
                    raise ArtifactError("The gzip trace has trailing garbage after the compressed data.")
                decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
                pending = rest
                continue
            # max_length bounds each step, so a bomb is caught one chunk past the limit.
            chunk = decomp.decompress(pending, READ_CHUNK)
            pending = decomp.unconsumed_tail
            if not chunk and not pending and not decomp.eof and source_done:
                raise ArtifactError("The gzip trace is truncated (the compressed stream ends early).")
            out_total += len(chunk)
            if out_total > limit:
                raise ArtifactError(
                    f"The gzip trace decompresses to more than the limit of {limit:,} bytes "
                    "(a gzip bomb, or a trace too large to analyse)."
                )
            if chunk:
                yield chunk
    except zlib.error as exc:
        raise ArtifactError(f"The trace is not a valid gzip file: {exc}.") from exc
