"""Read `nsys stats` reports (CSV or the default column layout) into normalised rows.

The reading half of `jobs.profiling.nsys_stats`, which summarises the rows.

Input is one report file (e.g. `prefix_cuda_gpu_kern_sum.csv` from `nsys stats -o prefix`) or nsys's
stdout, which mixes several reports with "Processing [...]" / "SKIPPED:" / "** Title (report):" lines.
Each table is recognised by its banner when present and by its header otherwise, so old report names
(gpukernsum, cudaapisum...) and older column names (Average, Minimum...) work too.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.profiling.detect import DEFAULT_MAX_BYTES, iter_lines, open_text
from jobs.profiling.errors import ArtifactError
from jobs.profiling.guard import checkpoint, guarded

_REPORT_ALIASES = {
    "gpukernsum": "cuda_gpu_kern_sum",
    "cuda_gpu_kern_gb_sum": "cuda_gpu_kern_sum",
    "cudaapisum": "cuda_api_sum",
    "gpumemtimesum": "cuda_gpu_mem_time_sum",
    "gpumemsizesum": "cuda_gpu_mem_size_sum",
    "nvtxppsum": "nvtx_sum",
    "nvtx_pushpop_sum": "nvtx_sum",
    "nvtxsum": "nvtx_sum",
    "gputrace": "cuda_gpu_trace",
    "osrtsum": "osrt_sum",
}
SUPPORTED_REPORTS = (
    "cuda_gpu_kern_sum",
    "cuda_api_sum",
    "cuda_gpu_mem_time_sum",
    "cuda_gpu_mem_size_sum",
    "nvtx_sum",
    "cuda_gpu_trace",
)
_TIME_UNITS = {"ns": 1.0, "us": 1e3, "μs": 1e3, "usec": 1e3, "ms": 1e6, "s": 1e9, "sec": 1e9}
_SIZE_UNITS = {
    "b": 1.0,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "kib": 1024.0,
    "mib": 1024.0**2,
    "gib": 1024.0**3,
}
_COLUMN_KEYS = {
    "time": "time_pct",
    "time(%)": "time_pct",
    "total time": "total_time",
    "instances": "count",
    "num calls": "count",
    "calls": "count",
    "count": "count",
    "operations": "count",
    "avg": "avg",
    "average": "avg",
    "med": "med",
    "median": "med",
    "min": "min",
    "minimum": "min",
    "max": "max",
    "maximum": "max",
    "stddev": "stddev",
    "name": "name",
    "operation": "name",
    "range": "name",
    "style": "style",
    "total": "total",
    "start": "start",
    "duration": "duration",
    "corrid": "corr_id",
    "bytes": "bytes",
    "device": "device",
    "strm": "stream",
    "grdx": "grid_x",
    "grdy": "grid_y",
    "grdz": "grid_z",
    "blkx": "block_x",
    "blky": "block_y",
    "blkz": "block_z",
    "category": "category",
}
_BANNER = re.compile(r"\*\*\s*(.*?)\s*\((\w+)\)\s*:?\s*$")
# "Processing [x.sqlite] with [.../cuda_gpu_kern_sum.py]..." (2022+),
# "Running [.../gpukernsum.py x.sqlite]..." (older)
_PROCESSING = re.compile(r"^(?:Processing|Running) \[.*?(\w+)\.py\b")
_DASHES = re.compile(r"-{2,}")
# nvprof's console lines carry the profiled process id: "==69548== Profiling result:" (CUDA Toolkit
# Profiler User's Guide, nvprof "Summary Mode"). Its tables share "Time(%)" with old nsys ones but not their
# layout (one "Type" column, units inside the cells), so they are named and left unread.
_NVPROF = re.compile(
    r"^==\d+== (?:NVPROF is profiling|Profiling application|Profiling result|Unified Memory)"
)
NVPROF = "nvprof"
NVPROF_REASON = (
    "nvprof output (its summary tables are not read): profile with `nsys profile --stats=true` and upload "
    "that output or `nsys stats --format csv` reports"
)
#: Values beyond this magnitude are unknown; rows, columns and names are capped so a hostile file
#: cannot grow the parse without bound.
MAX_VALUE = 1e30
MAX_ROWS = 5_000_000
MAX_COLUMNS = 256
MAX_NAME_CHARS = 4096
_TRACE_KEYS = {
    "start",
    "duration",
    "device",
    "name",
    "grid_x",
    "grid_y",
    "grid_z",
    "block_x",
    "block_y",
    "block_z",
}
_DIMS = (
    ("grid_blocks", ("grid_x", "grid_y", "grid_z")),
    ("block_threads", ("block_x", "block_y", "block_z")),
)
_UNIT = re.compile(r"^(.*?)\s*\(([^()]*)\)\s*$")


@dataclass
class _Table:
    report: str | None
    header: list[str]
    rows: Iterator[list[str]]


class _Lines:
    """Lines of the upload with one line of lookahead (the layout is decided by the next line)."""

    def __init__(self, lines: Iterator[str]) -> None:
        self._lines = lines
        self._next: str | None = None
        self._peeked = False

    def peek(self) -> str | None:
        if not self._peeked:
            self._next = next(self._lines, None)
            self._peeked = True
        return self._next

    def pop(self) -> str | None:
        line = self.peek()
        self._peeked = False
        return line


@dataclass
class NsysStats:
    """Reports found in one upload: report name -> normalised rows (times in ns, sizes in bytes)."""

    reports: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)


def _report_from_filename(filename: str | None) -> str | None:
    if not filename:
        return None
    stem = Path(filename).name.lower()
    for name in (*SUPPORTED_REPORTS, *_REPORT_ALIASES):
        if name in stem:
            return _REPORT_ALIASES.get(name, name)
    return None


def _iter_tables(
    lines: Iterator[str], default_report: str | None
) -> Iterator[_Table | tuple[str | None, str]]:
    """Yield tables (their rows streamed: read them before asking for the next table), and
    (report, reason) tuples for SKIPPED / no-data messages."""
    src = _Lines(lines)
    report = default_report
    nvprof_seen = False
    while (line := src.pop()) is not None:
        stripped = line.strip()
        if not stripped or stripped.startswith(("Generating SQLite", "NOTICE", "WARNING", "Exporting")):
            continue
        if stripped.startswith("==") and _NVPROF.match(stripped[:200]):
            if not nvprof_seen:
                nvprof_seen = True
                yield (NVPROF, NVPROF_REASON)
            continue
        # Banners are short: matching these patterns on a 300 kB line would backtrack quadratically.
        if len(stripped) <= 2000 and (m := _PROCESSING.match(stripped)):
            report = m.group(1)
            continue
        if len(stripped) <= 2000 and (m := _BANNER.match(stripped)):
            report = m.group(2)
            continue
        if (
            stripped.startswith("SKIPPED:")
            or "does not contain" in stripped
            or "no data was returned" in stripped
        ):
            yield (report, stripped.removeprefix("SKIPPED:").strip()[:300])
            continue
        following = src.peek()
        if following is not None and _is_dash_line(following):
            # nsys's default "column" layout: the dash line under the header gives the column spans.
            spans = _spans(following)[:MAX_COLUMNS]
            header = _slice(line, spans)
            if not _is_header(header):
                continue
            src.pop()
            rows: Iterator[list[str]] = _column_rows(src, spans)
        else:
            header = _csv_cells(stripped)
            if not _is_header(header):
                continue
            rows = _csv_rows(src)
        yield _Table(report, header, rows)
        for _ in rows:  # whatever the consumer left unread belongs to this table
            pass
        report = default_report


def _column_rows(src: _Lines, spans: list[tuple[int, int]]) -> Iterator[list[str]]:
    while (line := src.peek()) is not None and line.strip():
        src.pop()
        checkpoint()
        yield _slice(line, spans)


def _csv_rows(src: _Lines) -> Iterator[list[str]]:
    while (line := src.peek()) is not None and line.strip():
        cells = _csv_cells(line.strip())
        if len(cells) < 2 or (_number(cells[0]) is None and _is_header(cells)):
            return
        src.pop()
        checkpoint()
        yield cells


def _csv_cells(line: str) -> list[str]:
    try:
        return [cell.strip() for cell in next(csv.reader([line]), [])[:MAX_COLUMNS]]
    except csv.Error:
        return []


def _is_header(cells: list[str]) -> bool:
    if len(cells) < 2:
        return False
    keys = [_canon(cell)[0] for cell in cells]
    if any(_number(cell) is not None for cell in cells if cell):
        return False
    return "name" in keys or ("start" in keys and "duration" in keys)


def _spans(dash_line: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in _DASHES.finditer(dash_line)]


def _slice(line: str, spans: list[tuple[int, int]]) -> list[str]:
    # Columns are separated by the dash groups' starts; the last (Name) runs to the end of the line.
    cells = []
    for index, (start, _end) in enumerate(spans):
        stop = spans[index + 1][0] if index + 1 < len(spans) else len(line)
        cells.append(line[start:stop].strip())
    return cells


def _is_dash_line(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and set(stripped) <= {"-", " "} and bool(_DASHES.search(stripped))


def _canon(column: str) -> tuple[str | None, str | None]:
    """Canonical key and unit of a column title, e.g. "Avg (ns)" -> ("avg", "ns")."""
    title = column.strip().strip('"')
    unit = None
    if title.lower().replace(" ", "") == "time(%)":
        return "time_pct", "%"
    if m := _UNIT.match(title):
        title, unit = m.group(1), m.group(2).strip()
    key = _COLUMN_KEYS.get(title.lower())
    if key == "time_pct" or (key == "time" and unit == "%"):
        return "time_pct", "%"
    return key, unit


def _number(text: str) -> float | None:
    cleaned = text.strip().strip('"').replace(",", "")
    if not cleaned or len(cleaned) > 64 or cleaned.lower() in {"nan", "-nan", "n/a", "-"}:
        return None
    try:
        value = float(cleaned)
    except ValueError:
        return None
    # NaN, infinities and magnitudes no report reaches (1e309, 10^23 ns) are unknown: sums and
    # conversions to integers stay finite.
    return value if -MAX_VALUE < value < MAX_VALUE else None


def _scale(unit: str | None, key: str) -> float:
    if unit is None:
        return 1.0  # old reports (Average, Minimum...) are in ns; old KiB sizes are fixed by the caller
    u = unit.lower().replace(" ", "")
    if key in {"total", "bytes"} or (key in {"avg", "med", "min", "max", "stddev"} and u in _SIZE_UNITS):
        return _SIZE_UNITS.get(u, 1.0)
    return _TIME_UNITS.get(u, 1.0)


def _records(table: _Table) -> list[dict[str, Any]]:
    canon = [_canon(col) for col in table.header]
    keys = {key for key, _ in canon}
    if "start" in keys and "duration" in keys:
        # A per-launch trace can hold millions of rows: keep only what the summaries read.
        canon = [(key, unit) if key in _TRACE_KEYS else (None, None) for key, unit in canon]
    text_keys = {"name", "style", "device", "category"}
    names: dict[str, str] = {}  # one string object per distinct name
    records = []
    for cells in table.rows:
        record: dict[str, Any] = {}
        for (key, unit), cell in zip(canon, cells, strict=False):
            if key is None or key in record:
                continue
            if key in text_keys:
                text = cell[:MAX_NAME_CHARS]
                record[key] = names.setdefault(text, text) if len(names) < 1_000_000 else text
            else:
                value = _number(cell)
                record[key] = None if value is None else value * _scale(unit, key)
        if "grid_x" in record or "block_x" in record:
            # A launch's dimensions as products (thread blocks, threads per block): two keys per row, not
            # six; memcpy/memset rows leave them empty (None).
            for product, parts in _DIMS:
                dims = [record.pop(part, None) for part in parts]
                # CUDA's limits: gridDim.x < 2^31, y and z < 2^16, at most 1,024 threads per block (CUDA C++
                # Programming Guide, "Features and Technical Specifications"); beyond them a cell is unknown.
                known = all(d is not None and 0 < d < 2**31 for d in dims)
                record[product] = int(dims[0] * dims[1] * dims[2]) if known else None
        if record.get("name") is not None or "start" in record:
            records.append(record)
            if len(records) > MAX_ROWS:
                raise ArtifactError(
                    f"The nsys stats report {table.report or ''} has more than {MAX_ROWS:,} rows; "
                    "upload the *_sum reports instead of the per-launch trace."
                )
    return records


def _classify(report: str | None, header: list[str], records: list[dict[str, Any]]) -> str | None:
    report = _REPORT_ALIASES.get(report or "", report)
    keys = {_canon(col)[0] for col in header}
    titles = {_canon(col)[0]: col.lower() for col in header}
    if report in SUPPORTED_REPORTS or report == "osrt_sum":
        return report
    if report is not None and report not in SUPPORTED_REPORTS and "_" in report:
        return None  # a named report we do not analyse (osrt, nvtx_gpu_proj, cuda_gpu_sum...)
    if "start" in keys and "duration" in keys:
        return "cuda_gpu_trace" if keys & {"grid_x", "stream", "device", "bytes"} else None
    if "category" in keys:
        return None
    name_title = titles.get("name", "")
    if name_title.startswith("operation"):
        return "cuda_gpu_mem_time_sum" if "total_time" in keys else "cuda_gpu_mem_size_sum"
    if name_title.startswith("range"):
        return "nvtx_sum"
    if "total_time" not in keys:
        return None
    if "instances" in titles.get("count", ""):
        return "cuda_gpu_kern_sum"
    if "call" in titles.get("count", ""):
        names = [str(r.get("name", "")) for r in records]
        cuda = sum(1 for n in names if n.startswith(("cuda", "cu", "nccl", "cublas", "cudnn")))
        return "cuda_api_sum" if names and cuda >= len(names) / 2 else "osrt_sum"
    return None


@guarded("nsys stats file", storable=False)
def parse_nsys_stats(
    source: bytes | str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES, filename: str | None = None
) -> NsysStats:
    """Parse one nsys stats CSV (or stdout holding several reports) into normalised rows.

    Times are converted to ns and sizes to bytes whatever `--timeunit` was used. `filename` (the upload's
    name) names the report when the file holds a single table without a banner.
    """
    if filename is None and isinstance(source, str | Path):
        filename = Path(source).name
    result = NsysStats()
    with open_text(source, max_bytes, what="nsys stats file") as text:
        for item in _iter_tables(iter_lines(text), _report_from_filename(filename)):
            _add_table(result, item)
    if not result.reports:
        if any(s["report"] == NVPROF for s in result.skipped):
            raise ArtifactError(f"This is {NVPROF_REASON}.")
        found = "; ".join(f"{s['report']}: {s['reason']}" for s in result.skipped[:5])
        raise ArtifactError(
            "No nsys stats report found (expected e.g. cuda_gpu_kern_sum, cuda_api_sum, "
            "cuda_gpu_mem_time_sum from `nsys stats --format csv`)." + (f" Seen: {found}" if found else "")
        )
    return result


def _add_table(result: NsysStats, item: _Table | tuple[str | None, str]) -> None:
    if isinstance(item, tuple):
        report, reason = item
        if len(result.skipped) < 1000:
            result.skipped.append(
                {"report": _REPORT_ALIASES.get(report or "", report or "unknown"), "reason": reason}
            )
        return
    records = _records(item)
    kind = _classify(item.report, item.header, records)
    if kind is None:
        if len(result.skipped) < 1000:
            result.skipped.append(
                {
                    "report": (item.report or "unknown")[:200],
                    "reason": "report type not analysed: " + ",".join(item.header)[:200],
                }
            )
        return
    if kind == "cuda_gpu_mem_size_sum" and all(_canon(col)[1] is None for col in item.header):
        # Old gpumemsizesum printed sizes in KiB with no unit in the header.
        for record in records:
            for key in ("total", "avg", "med", "min", "max", "stddev"):
                if record.get(key) is not None:
                    record[key] *= 1024.0
    rows = result.reports.setdefault(kind, [])
    if len(rows) + len(records) > MAX_ROWS:
        raise ArtifactError(
            f"The nsys stats file has more than {MAX_ROWS:,} {kind} rows; upload the *_sum reports instead."
        )
    rows.extend(records)
