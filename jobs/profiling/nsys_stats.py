"""Parse `nsys stats` reports (CSV or the default column layout) and summarise them.

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

TINY_KERNEL_US = 10.0
NCCL_NAME = re.compile(r"nccl|^hccl|^rccl", re.IGNORECASE)
_SYNC_API = re.compile(
    r"^(cuda(Stream|Device|Event|Thread|Ctx)Synchronize|cu(Stream|Ctx|Event)Synchronize|cudaStreamQuery)"
)
_LAUNCH_API = re.compile(r"^(cudaLaunch|cuLaunch|cudaGraphLaunch|cuGraphLaunch)")
_API_SUFFIX = re.compile(r"(_v\d+|_ptsz|_ptds)+$")

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
    "category": "category",
}
_BANNER = re.compile(r"\*\*\s*(.*?)\s*\((\w+)\)\s*:?\s*$")
# "Processing [x.sqlite] with [.../cuda_gpu_kern_sum.py]..." (2022+),
# "Running [.../gpukernsum.py x.sqlite]..." (older)
_PROCESSING = re.compile(r"^(?:Processing|Running) \[.*?(\w+)\.py\b")
_DASHES = re.compile(r"-{2,}")
#: Values beyond this magnitude are unknown; rows, columns and names are capped so a hostile file
#: cannot grow the parse without bound.
MAX_VALUE = 1e30
MAX_ROWS = 5_000_000
MAX_COLUMNS = 256
MAX_NAME_CHARS = 4096
_TRACE_KEYS = {"start", "duration", "device", "name"}
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
    while (line := src.pop()) is not None:
        stripped = line.strip()
        if not stripped or stripped.startswith(("Generating SQLite", "NOTICE", "WARNING", "Exporting")):
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


def _ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 6)


def _us(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e3, 4)


def _pct(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 3) if whole > 0 else None


def _memop(label: str) -> str:
    text = label.strip("[] ").removeprefix("CUDA ").strip()
    text = text.replace("memcpy ", "").replace("Host-to-Device", "HtoD").replace("Device-to-Host", "DtoH")
    text = (
        text.replace("Device-to-Device", "DtoD")
        .replace("Host-to-Host", "HtoH")
        .replace("Peer-to-Peer", "PtoP")
    )
    return text


def _kernel_summary(
    rows: list[dict[str, Any]], trace: list[dict[str, Any]] | None, top_n: int
) -> dict[str, Any]:
    total = sum(r.get("total_time") or 0.0 for r in rows)
    instances = sum(r.get("count") or 0.0 for r in rows)
    top = []
    for r in sorted(rows, key=lambda r: r.get("total_time") or 0.0, reverse=True)[:top_n]:
        top.append(
            {
                "name": r.get("name"),
                "time_pct": r.get("time_pct")
                if r.get("time_pct") is not None
                else _pct(r.get("total_time") or 0, total),
                "total_time_ms": _ms(r.get("total_time")),
                "instances": int(r.get("count") or 0),
                "avg_us": _us(r.get("avg")),
                "med_us": _us(r.get("med")),
                "min_us": _us(r.get("min")),
                "max_us": _us(r.get("max")),
            }
        )
    thr = TINY_KERNEL_US * 1e3
    trace_kernels = [t for t in trace or [] if not str(t.get("name", "")).startswith("[CUDA ")]
    tiny_count: float
    tiny_time: float
    all_count: float
    all_time: float
    if trace_kernels:
        method = "per_instance"
        tiny = [t for t in trace_kernels if (t.get("duration") or 0.0) < thr]
        tiny_count, tiny_time = len(tiny), sum(t.get("duration") or 0.0 for t in tiny)
        all_count, all_time = len(trace_kernels), sum(t.get("duration") or 0.0 for t in trace_kernels)
    else:
        # Without per-launch data a kernel's launches count as tiny when its average is under the threshold,
        # unless min/max prove all (max < thr) or none (min >= thr) are.
        method = "estimated_from_avg"
        tiny_count = tiny_time = 0.0
        for r in rows:
            lo, hi, avg = r.get("min"), r.get("max"), r.get("avg")
            is_tiny = (hi is not None and hi < thr) or (
                not (lo is not None and lo >= thr) and avg is not None and avg < thr
            )
            if is_tiny:
                tiny_count += r.get("count") or 0.0
                tiny_time += r.get("total_time") or 0.0
        all_count, all_time = instances, total
    nccl = [r for r in rows if NCCL_NAME.search(str(r.get("name", "")))]
    nccl_time = sum(r.get("total_time") or 0.0 for r in nccl)
    return {
        "total_time_ms": _ms(total),
        "instances": int(instances),
        "distinct_kernels": len(rows),
        "avg_kernel_us": _us(total / instances) if instances else None,
        "top": top,
        "tiny_threshold_us": TINY_KERNEL_US,
        "tiny_method": method,
        "tiny_instance_share_pct": _pct(tiny_count, all_count),
        "tiny_time_share_pct": _pct(tiny_time, all_time),
        "nccl_time_ms": _ms(nccl_time),
        "nccl_time_share_pct": _pct(nccl_time, total),
        "nccl_instances": int(sum(r.get("count") or 0.0 for r in nccl)),
    }


def _kernels_from_trace(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[str, list[float]] = {}
    for t in trace:
        name = str(t.get("name", ""))
        if not name.startswith("[CUDA ") and t.get("duration") is not None:
            groups.setdefault(name, []).append(t["duration"])
    return [
        {
            "name": n,
            "total_time": sum(d),
            "count": len(d),
            "avg": sum(d) / len(d),
            "min": min(d),
            "max": max(d),
        }
        for n, d in groups.items()
    ]


def _memcpy_summary(times: list[dict[str, Any]], sizes: list[dict[str, Any]]) -> dict[str, Any]:
    by_op: dict[str, dict[str, Any]] = {}
    for r in times:
        op = _memop(str(r.get("name", "")))
        entry = by_op.setdefault(op, {"operation": op, "label": r.get("name"), "time_ns": 0.0, "count": 0.0})
        entry["time_ns"] += r.get("total_time") or 0.0
        entry["count"] += r.get("count") or 0.0
    for r in sizes:
        op = _memop(str(r.get("name", "")))
        entry = by_op.setdefault(
            op, {"operation": op, "label": r.get("name"), "time_ns": None, "count": r.get("count")}
        )
        entry["bytes"] = (entry.get("bytes") or 0.0) + (r.get("total") or 0.0)
    total_time = sum(e["time_ns"] or 0.0 for e in by_op.values())
    out = []
    for e in sorted(by_op.values(), key=lambda e: (e["time_ns"] or 0.0, e.get("bytes") or 0.0), reverse=True):
        nbytes, t = e.get("bytes"), e["time_ns"]
        out.append(
            {
                "operation": e["operation"],
                "label": e["label"],
                "total_time_ms": _ms(t),
                "time_pct": _pct(t or 0.0, total_time),
                "count": int(e["count"] or 0),
                "avg_us": _us(t / e["count"]) if t is not None and e["count"] else None,
                "total_bytes": None if nbytes is None else int(nbytes),
                "throughput_gb_per_s": round(nbytes / t, 3) if nbytes and t else None,
            }
        )
    copy_time = sum(e["time_ns"] or 0.0 for e in by_op.values() if e["operation"] != "memset")
    return {
        "total_time_ms": _ms(total_time) if times else None,
        "memcpy_time_ms": _ms(copy_time) if times else None,
        "by_operation": out,
    }


def _api_summary(rows: list[dict[str, Any]], top_n: int) -> dict[str, Any]:
    total = sum(r.get("total_time") or 0.0 for r in rows)
    sync: dict[str, dict[str, float]] = {}
    launch_calls = 0.0
    for r in rows:
        base = _API_SUFFIX.sub("", str(r.get("name", "")))
        if _SYNC_API.match(base):
            entry = sync.setdefault(base, {"time": 0.0, "calls": 0.0})
            entry["time"] += r.get("total_time") or 0.0
            entry["calls"] += r.get("count") or 0.0
        if _LAUNCH_API.match(base):
            launch_calls += r.get("count") or 0.0
    sync_time = sum(e["time"] for e in sync.values())
    top = sorted(rows, key=lambda r: r.get("total_time") or 0.0, reverse=True)[:top_n]
    return {
        "total_time_ms": _ms(total),
        "calls": int(sum(r.get("count") or 0.0 for r in rows)),
        "launch_calls": int(launch_calls),
        "sync_time_ms": _ms(sync_time),
        "sync_calls": int(sum(e["calls"] for e in sync.values())),
        "sync_share_of_api_pct": _pct(sync_time, total),
        "sync_by_call": [
            {"name": n, "total_time_ms": _ms(e["time"]), "calls": int(e["calls"])}
            for n, e in sorted(sync.items(), key=lambda kv: kv[1]["time"], reverse=True)
        ],
        "top": [
            {
                "name": r.get("name"),
                "time_pct": r.get("time_pct"),
                "total_time_ms": _ms(r.get("total_time")),
                "calls": int(r.get("count") or 0),
                "avg_us": _us(r.get("avg")),
            }
            for r in top
        ],
    }


def _nvtx_summary(rows: list[dict[str, Any]], top_n: int) -> dict[str, Any]:
    top = sorted(rows, key=lambda r: r.get("total_time") or 0.0, reverse=True)[:top_n]
    return {
        "range_count": len(rows),
        "ranges": [
            {
                "range": r.get("name"),
                "style": r.get("style"),
                "time_pct": r.get("time_pct"),
                "total_time_ms": _ms(r.get("total_time")),
                "instances": int(r.get("count") or 0),
                "avg_ms": _ms(r.get("avg")),
            }
            for r in top
        ],
    }


def _trace_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    per_device: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        start, dur = r.get("start"), r.get("duration")
        if start is not None and dur is not None:
            per_device.setdefault(str(r.get("device") or "?"), []).append((start, start + dur))
    devices = []
    for device, intervals in sorted(per_device.items()):
        intervals.sort()
        busy, cur_s, cur_e = 0.0, intervals[0][0], intervals[0][1]
        for s, e in intervals[1:]:
            if s > cur_e:
                busy += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        busy += cur_e - cur_s
        span = max(e for _, e in intervals) - intervals[0][0]
        devices.append(
            {
                "device": device,
                "span_ms": _ms(span),
                "busy_ms": _ms(busy),
                "idle_pct": _pct(span - busy, span),
                "operations": len(intervals),
            }
        )
    kernels = sum(1 for r in rows if not str(r.get("name", "")).startswith("[CUDA "))
    return {"events": len(rows), "kernel_launches": kernels, "devices": devices}


@guarded("nsys stats file")
def analyze_nsys_stats(
    source: bytes | str | Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    filename: str | None = None,
    top_n: int = 20,
) -> dict[str, Any]:
    """Summarise nsys stats reports: kernels, memcpy by operation, sync API time, NVTX ranges, GPU trace.

    Sections whose report is absent are None. Raises ArtifactError when no known report is found.
    """
    stats = parse_nsys_stats(source, max_bytes=max_bytes, filename=filename)
    reports = stats.reports
    trace = reports.get("cuda_gpu_trace")
    kern_rows = reports.get("cuda_gpu_kern_sum") or (_kernels_from_trace(trace) if trace else None)
    mem_time, mem_size = reports.get("cuda_gpu_mem_time_sum", []), reports.get("cuda_gpu_mem_size_sum", [])
    return {
        "format": "nsys_stats_csv",
        "reports_found": sorted(reports),
        "reports_skipped": stats.skipped[:50],
        "kernels": _kernel_summary(kern_rows, trace, top_n) if kern_rows else None,
        "memory_ops": _memcpy_summary(mem_time, mem_size) if mem_time or mem_size else None,
        "cuda_api": _api_summary(reports["cuda_api_sum"], top_n) if "cuda_api_sum" in reports else None,
        "nvtx": _nvtx_summary(reports["nvtx_sum"], top_n) if "nvtx_sum" in reports else None,
        "gpu_trace": _trace_summary(trace) if trace else None,
    }
