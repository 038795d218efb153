"""Recognise an uploaded profiling artifact from its name and first bytes, and read uploads safely.

`detect_kind` only looks at a bounded prefix (gzip is decompressed up to a bounded prefix too), so it
is cheap enough to run in the upload request. `load_bytes` and `decode_text` are the shared, size-limited
readers that the text parsers (nsys stats, ncu, py-spy, nvidia-smi, dstat) use.
"""

from __future__ import annotations

import gzip
import io
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from jobs.profiling.errors import ArtifactError
from jobs.profiling.guard import checkpoint, grow_input

KINETO = "kineto"
NSYS_SQLITE = "nsys_sqlite"
NSYS_STATS_CSV = "nsys_stats_csv"
NCU_CSV = "ncu_csv"
PYSPY_RAW = "pyspy_raw"
PYSPY_SPEEDSCOPE = "pyspy_speedscope"
NVIDIA_SMI_CSV = "nvidia_smi_csv"
DSTAT_CSV = "dstat_csv"
SVG = "svg"
HTML = "html"

#: Kinds a parser exists for.
SUPPORTED_KINDS: frozenset[str] = frozenset(
    {KINETO, NSYS_SQLITE, NSYS_STATS_CSV, NCU_CSV, PYSPY_RAW, PYSPY_SPEEDSCOPE, NVIDIA_SMI_CSV, DSTAT_CSV}
)

#: Kinds that are recognised only so the caller can refuse them with this message.
REJECTED_KINDS: dict[str, str] = {
    SVG: (
        "SVG flame graphs are not supported (they are pictures with embedded scripts, not data): "
        "upload py-spy raw output (py-spy record --format raw) or speedscope JSON (--format speedscope)."
    ),
    HTML: "HTML pages are not supported: upload the profiler's data file (trace JSON, CSV, SQLite export).",
}

#: How much of an upload detection reads. Kineto traces can carry a long distributedInfo header.
HEAD_BYTES = 256 * 1024
DEFAULT_MAX_BYTES = 256 * 1024 * 1024

_SQLITE_MAGIC = b"SQLite format 3\x00"
_GZIP_MAGIC = b"\x1f\x8b"
_NSMI_TS = re.compile(r"^\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}(\.\d+)?\s*,")
_RAW_STACK_LINE = re.compile(r"^(\S.*) (\d+)$")
_NSYS_MARKERS = (
    "Time (%)",
    "Time(%)",
    "Total Time (ns)",
    "Total Time (us)",
    "Total Time (ms)",
    "Total Time (s)",
    "Start (ns)",
    "Processing [",
    "_sum.py]",
    "gpukernsum",
    "cudaapisum",
    "(cuda_gpu_",
    "(cuda_api_",
    "(nvtx_",
)
_BINARY_REPORT_HINTS = {
    ".nsys-rep": "an Nsight Systems binary report: export it with `nsys export --type sqlite` "
    "or upload `nsys stats --format csv` output",
    ".qdrep": "an Nsight Systems binary report: export it with `nsys export --type sqlite` "
    "or upload `nsys stats --format csv` output",
    ".ncu-rep": "an Nsight Compute binary report: upload `ncu --csv --page details -i FILE.ncu-rep` output",
    ".pt": "a PyTorch checkpoint, not a profiler artifact",
}


def load_bytes(
    source: bytes | str | Path, max_bytes: int = DEFAULT_MAX_BYTES, *, what: str = "file"
) -> bytes:
    """Return the artifact's bytes, gunzipped if compressed, refusing anything over `max_bytes`.

    `source` is raw bytes or a filesystem path (str or Path). The limit applies to the decompressed size,
    so a small gzip bomb is refused as well.
    """
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        if len(data) > max_bytes:
            raise ArtifactError(f"The {what} is {len(data):,} bytes; the limit is {max_bytes:,} bytes.")
    else:
        path = Path(source)
        try:
            size = path.stat().st_size
            if size > max_bytes:
                raise ArtifactError(f"The {what} is {size:,} bytes; the limit is {max_bytes:,} bytes.")
            with path.open("rb") as handle:
                # Not read(max_bytes + 1): that allocates the whole limit (1 GiB) up front.
                data = handle.read(size + 1)
                if len(data) > size and len(data) <= max_bytes:
                    data += handle.read(max_bytes + 1 - len(data))  # the file grew while we read it
        except OSError as exc:
            raise ArtifactError(f"The {what} cannot be read: {exc.strerror or exc}.") from exc
        if len(data) > max_bytes:
            raise ArtifactError(f"The {what} is larger than the limit of {max_bytes:,} bytes.")
    if data[:2] == _GZIP_MAGIC:
        data = _gunzip(data, max_bytes, what)
        grow_input(len(data))
    return data


def _gunzip(data: bytes, max_bytes: int, what: str) -> bytes:
    out = io.BytesIO()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
            while chunk := stream.read(1 << 20):
                out.write(chunk)
                if out.tell() > max_bytes:
                    raise ArtifactError(
                        f"The {what} decompresses to more than the limit of {max_bytes:,} bytes."
                    )
    except (OSError, EOFError, zlib.error) as exc:
        raise ArtifactError(f"The {what} is not a valid gzip file: {exc}.") from exc
    return out.getvalue()


def decode_text(data: bytes) -> str:
    """Decode an uploaded text artifact: UTF-8 (with or without BOM) or UTF-16 with BOM.

    UTF-16 matters because PowerShell's `>` redirection writes nvidia-smi output as UTF-16LE.
    Undecodable bytes are replaced rather than fatal: names are later escaped, numbers still parse.
    """
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return data.decode("utf-16", errors="replace")
    if b"\x00" in data[:4096]:
        raise ArtifactError("This looks like a binary file, not a text (CSV or log) file.")
    return data.decode("utf-8-sig", errors="replace")


class _BoundedReader(io.RawIOBase):
    """A binary stream over an upload that refuses to yield more than `limit` bytes (decompressed) and
    turns read errors (truncated gzip, I/O errors) into `ArtifactError`."""

    def __init__(self, raw: BinaryIO, limit: int, what: str, *, gzipped: bool) -> None:
        super().__init__()
        self._raw = raw
        self._limit = limit
        self._what = what
        self._gzipped = gzipped
        self.count = 0
        self._reported = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            data = self._raw.read(len(buffer))
        except (OSError, EOFError, zlib.error) as exc:
            kind = "gzip file" if self._gzipped else "file"
            raise ArtifactError(f"The {self._what} is not a readable {kind}: {exc}.") from exc
        n = len(data)
        buffer[:n] = data
        self.count += n
        if self.count > self._limit:
            raise ArtifactError(
                f"The {self._what} {'decompresses to' if self._gzipped else 'is'} more than the limit of "
                f"{self._limit:,} bytes."
            )
        if self._gzipped and self.count - self._reported > 1 << 20:
            self._reported = self.count
            grow_input(self.count)
        return n

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            super().close()


@contextmanager
def open_text(
    source: bytes | str | Path, max_bytes: int = DEFAULT_MAX_BYTES, *, what: str = "file"
) -> Iterator[TextIO]:
    """A streaming text reader over an upload, decoded as `decode_text` does (UTF-8 with or without BOM,
    UTF-16 with BOM, undecodable bytes replaced), gunzipped when compressed, never past `max_bytes`.

    The text is read line by line (newline="" so `csv` sees quoted line breaks as they are), so a
    parser holds its rows, not the whole file and its rows at once. Errors are `ArtifactError`.
    """
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        if len(data) > max_bytes:
            raise ArtifactError(f"The {what} is {len(data):,} bytes; the limit is {max_bytes:,} bytes.")
        handle: BinaryIO = io.BytesIO(data)
    else:
        path = Path(source)
        try:
            size = path.stat().st_size
            if size > max_bytes:
                raise ArtifactError(f"The {what} is {size:,} bytes; the limit is {max_bytes:,} bytes.")
            handle = path.open("rb")
        except OSError as exc:
            raise ArtifactError(f"The {what} cannot be read: {exc.strerror or exc}.") from exc
    try:
        head = handle.read(4096)
        handle.seek(0)
    except OSError as exc:
        handle.close()
        raise ArtifactError(f"The {what} cannot be read: {exc.strerror or exc}.") from exc
    gzipped = head[:2] == _GZIP_MAGIC
    inner: BinaryIO = gzip.GzipFile(fileobj=handle, mode="rb") if gzipped else handle  # type: ignore[assignment]
    bounded = io.BufferedReader(_BoundedReader(inner, max_bytes, what, gzipped=gzipped), 1 << 16)
    try:
        if gzipped:
            head = bounded.peek(4096)[:4096]
        if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
            encoding = "utf-16"
        else:
            if b"\x00" in head:
                raise ArtifactError("This looks like a binary file, not a text (CSV or log) file.")
            encoding = "utf-8-sig"
        text = io.TextIOWrapper(bounded, encoding=encoding, errors="replace", newline="")
        try:
            yield text
        finally:
            text.detach()
    finally:
        bounded.close()
        handle.close()


def iter_lines(text: TextIO, max_line_chars: int = 1 << 20) -> Iterator[str]:
    """Lines of a text stream without their line ending; a line longer than `max_line_chars` is cut
    there (the rest of it is skipped), so one enormous line cannot hold the whole file."""
    while True:
        line = text.readline(max_line_chars)
        if not line:
            return
        if len(line) >= max_line_chars and not line.endswith(("\n", "\r")):
            while (rest := text.readline(max_line_chars)) and not rest.endswith(("\n", "\r")):
                pass
        checkpoint()
        yield line.rstrip("\r\n")


def read_head(source: bytes | str | Path, size: int = HEAD_BYTES) -> bytes:
    """The first `size` bytes of an upload (raw, still compressed if it is gzip)."""
    if isinstance(source, bytes | bytearray | memoryview):
        return bytes(source[:size])
    try:
        with Path(source).open("rb") as handle:
            return handle.read(size)
    except OSError as exc:
        raise ArtifactError(f"The file cannot be read: {exc.strerror or exc}.") from exc


def _gunzip_prefix(head: bytes, limit: int) -> bytes:
    # A truncated gzip stream is expected here (we only hold a prefix), so decompress incrementally.
    decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        return decomp.decompress(head, limit)
    except zlib.error as exc:
        raise ArtifactError(f"The file is not a valid gzip file: {exc}.") from exc


def detect_kind(filename: str, head_bytes: bytes) -> str:
    """Return the artifact kind of an upload from its name and first bytes.

    One of "kineto", "nsys_sqlite", "nsys_stats_csv", "ncu_csv", "pyspy_raw", "pyspy_speedscope",
    "nvidia_smi_csv", "dstat_csv", or "svg"/"html" (recognised so the caller can refuse them with
    `REJECTED_KINDS[kind]`). Raises ArtifactError when the format is not recognised.
    """
    name = (filename or "").lower()
    head = bytes(head_bytes[:HEAD_BYTES])
    if not head.strip():
        raise ArtifactError("The file is empty.")
    if head.startswith(_SQLITE_MAGIC):
        return NSYS_SQLITE
    for ext, hint in _BINARY_REPORT_HINTS.items():
        if name.endswith(ext):
            raise ArtifactError(f"{filename} is {hint}.")
    if head[:2] == _GZIP_MAGIC:
        head = _gunzip_prefix(head, HEAD_BYTES)
        if not head.strip():
            raise ArtifactError("The gzip file is empty.")
        if head.startswith(_SQLITE_MAGIC):
            raise ArtifactError("Upload the nsys SQLite export uncompressed.")
    if name.endswith((".sqlite", ".db", ".sqlite3")):
        raise ArtifactError(f"{filename} is not an SQLite database (the SQLite header is missing).")
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        head = head.decode("utf-16", errors="ignore").encode("utf-8")
    if b"\x00" in head[:4096]:
        raise ArtifactError("Unrecognised binary file: " + _supported_list())
    text = head.decode("utf-8-sig", errors="replace").lstrip()
    kind = _detect_markup(text) or _detect_json(text) or _detect_text(text)
    if kind is None:
        raise ArtifactError("Unrecognised artifact format. " + _supported_list())
    return kind


def _supported_list() -> str:
    return (
        "Supported: PyTorch profiler trace (.json/.json.gz), Nsight Systems SQLite export, "
        "nsys stats CSV, ncu CSV, py-spy raw or speedscope JSON, nvidia-smi CSV, dstat CSV."
    )


def _detect_markup(text: str) -> str | None:
    lowered = text[:2048].lower()
    if lowered.startswith("<?xml") or lowered.startswith("<svg") or lowered.startswith("<!doctype svg"):
        return SVG if "<svg" in text[:HEAD_BYTES].lower() else None
    if lowered.startswith(("<!doctype html", "<html")) or ("<html" in lowered and lowered.startswith("<")):
        return HTML
    return None


def _detect_json(text: str) -> str | None:
    if not text.startswith(("{", "[")):
        return None
    window = text[:HEAD_BYTES]
    if '"traceEvents"' in window:
        return KINETO
    if "speedscope" in window[:4096] or ('"shared"' in window and '"profiles"' in window):
        return PYSPY_SPEEDSCOPE
    if '"schemaVersion"' in window and ('"deviceProperties"' in window or '"distributedInfo"' in window):
        return KINETO
    raise ArtifactError(
        "This JSON file is neither a PyTorch profiler (Kineto) trace with traceEvents "
        "nor a speedscope profile."
    )


def _detect_text(text: str) -> str | None:
    lines = [line.strip() for line in text.splitlines()[:200]]
    lines = [line for line in lines if line]
    if not lines:
        return None
    first = lines[0]
    if first.startswith('"Dstat') or (first.startswith('"') and "CSV output" in first[:40]):
        return DSTAT_CSV
    sample = "\n".join(lines[:60])
    # Program output may precede ncu's CSV and nsys's tables, so look through the whole head for them.
    if "==PROF==" in text or ('"Kernel Name"' in text and ('"Metric Name"' in text or '"ID"' in text)):
        return NCU_CSV
    if any(marker in text for marker in _NSYS_MARKERS):
        return NSYS_STATS_CSV
    if '"total cpu usage"' in sample or ('"usr"' in sample and '"idl"' in sample):
        return DSTAT_CSV
    header = first.lower().replace(" ", "")
    if (
        "utilization.gpu" in header
        or "utilization_gpu" in header
        or header.startswith("timestamp,name,")
        or header.startswith("timestamp,index,")
        or "gpu_index" in header
        or "power.draw" in header
        or "temperature.gpu" in header
        or _NSMI_TS.match(first)
    ):
        return NVIDIA_SMI_CSV
    if _looks_like_pyspy_raw(lines):
        return PYSPY_RAW
    return None


def _looks_like_pyspy_raw(lines: list[str]) -> bool:
    candidates = lines[:50]
    if candidates and not _RAW_STACK_LINE.match(candidates[-1]):
        # The last line may be cut in the middle by the head limit.
        candidates = candidates[:-1]
    if not candidates:
        return False
    matched = [line for line in candidates if _RAW_STACK_LINE.match(line)]
    if len(matched) < max(1, int(0.9 * len(candidates))):
        return False
    return any(".py" in line or ";" in line or "<module>" in line for line in matched)
