"""The job's time-series figure, the per-GPU heatmap, straggler candidates and sparklines. Pure: no Django.

Every axis names its unit; every trace is downsampled to a pixel budget (jobs.metrics.downsample) with a
min/max
envelope wherever thinning could hide a spike; missing signals stay missing (a note in the chart, never a
line at 0). Times go to the browser as Unix milliseconds (Plotly's native date number).

Host names are escaped (jobs.charts.common.escape).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jobs.charts.common import BLACK, BLUE, FONT, GREEN, GREY, PURPLE, VERMILLION, escape
from jobs.metrics.downsample import MEAN_HIGH, MEAN_LOW, downsample_line, envelope, envelope_between
from jobs.metrics.signals import JobSignals, SignalSeries

DEFAULT_POINTS = 1000  # per trace: about one point per horizontal pixel of a laptop-wide chart
MAX_POINTS = 2400
MIN_POINTS = 100
HEATMAP_COLUMNS = 300
MAX_SHAPES = 240  # finding windows drawn; closer windows are merged first
# Points per envelope bucket of the line's budget: a bucket of about 4 line points (4-5 px on a laptop-wide
# chart) keeps a one-sample spike visible as a band that narrow, and the 15 envelopes (a polygon of 2 points
# per bucket each) cost the browser as much per point as the lines: at 1 bucket per 2 points they were
# about a quarter of the time series' first draw in headless Chromium (benchmarks/cold_load.py).
ENVELOPE_POINTS_PER_BUCKET = 4
#: Tick labels are not measured to hide those that overflow the plot (plotly's default for date and linear
#: axes measures every label after drawing it, one forced layout each): they fit inside the margins anyway.
TICKS_UNMEASURED = {"ticklabeloverflow": "allow"}


@dataclass(frozen=True, slots=True)
class Line:
    """One trace of a row: a signal key, its legend label, colour and dash style."""

    key: str
    label: str
    colour: str
    dash: str = "solid"


@dataclass(frozen=True, slots=True)
class Row:
    """One subplot: a title, the unit on its y axis, how raw values convert to that unit, its lines."""

    title: str
    unit: str
    scale: float
    digits: int
    lines: tuple[Line, ...]
    percent: bool = False
    # Lines drawn only when none of the `fallback_for` lines has data (NVLink total instead of TX/RX).
    fallback: tuple[Line, ...] = ()
    fallback_for: tuple[str, ...] = ()


ROWS: tuple[Row, ...] = (
    Row("Utilisation", "%", 100.0, 1, (
        Line("gpu_util", "nvidia-smi util", BLACK, "dot"),
        Line("sm_active", "SM active", BLUE),
        Line("tensor_active", "Tensor active", VERMILLION, "dash"),
        Line("dram_active", "DRAM active", GREEN, "dashdot"),
    ), percent=True),
    Row("Power", "W", 1.0, 0, (Line("power_usage", "Board power (mean per GPU)", BLUE),)),
    Row("Temperature", "°C", 1.0, 0, (
        Line("gpu_temp", "GPU", VERMILLION),
        Line("memory_temp", "Memory (HBM)", PURPLE, "dash"),
    )),
    Row("SM clock", "MHz", 1.0, 0, (Line("sm_clock", "SM clock", BLUE),)),
    Row("PCIe / NVLink", "GB/s", 1e-9, 3, (
        Line("pcie_rx_bytes", "PCIe RX (host → GPU)", BLUE),
        Line("pcie_tx_bytes", "PCIe TX (GPU → host)", BLUE, "dash"),
        Line("nvlink_rx_bytes", "NVLink RX", GREEN),
        Line("nvlink_tx_bytes", "NVLink TX", GREEN, "dash"),
    ), fallback=(Line("nvlink_bandwidth_total", "NVLink total (both directions)", GREEN, "dot"),),
       fallback_for=("nvlink_rx_bytes", "nvlink_tx_bytes")),
    Row("Memory", "GiB", 1 / 1024, 2, (Line("fb_used", "Frame buffer used (mean per GPU)", BLUE),)),
    Row("Throughput", "tokens/s", 1.0, 0, (Line("tokens_per_second", "Tokens/s (whole job)", BLACK),)),
    Row("MFU", "%", 100.0, 1, (Line("mfu", "MFU", VERMILLION),), percent=True),
)  # fmt: skip

# node_exporter's host levels beside the GPU rows (jobs.metrics.host_signals): drawn only for a job whose
# hosts have them (node_exporter is optional), so a job without them shows no empty host rows.
HOST_ROWS: tuple[Row, ...] = (
    Row("Host CPU and memory", "%", 100.0, 1, (
        Line("host_cpu_busy", "CPU busy (mean per host)", BLUE),
        Line("host_cpu_iowait", "CPU iowait", VERMILLION, "dash"),
        Line("host_mem_available", "Memory available", GREEN, "dot"),
    ), percent=True),
    Row("Host disk and network", "GB/s", 1e-9, 3, (
        Line("host_disk_read_bytes", "Disk read (per host)", BLUE),
        Line("host_disk_write_bytes", "Disk write", BLUE, "dash"),
        Line("host_net_rx_bytes", "Ethernet RX", PURPLE),
        Line("host_net_tx_bytes", "Ethernet TX", PURPLE, "dash"),
        Line("host_ib_rx_bytes", "InfiniBand RX", GREEN),
        Line("host_ib_tx_bytes", "InfiniBand TX", GREEN, "dash"),
    )),
)  # fmt: skip

CHART_SIGNALS: tuple[str, ...] = (
    *(line.key for row in (*ROWS, *HOST_ROWS) for line in (*row.lines, *row.fallback)),
    "fb_free",
)
"""Signal keys the time-series figure reads (fb_free gives the memory capacity line)."""


@dataclass(frozen=True, slots=True)
class FindingMark:
    """A finding as the charts need it: stable code, number in the list, colour, windows in Unix seconds."""

    code: str
    number: int
    title: str
    colour: str
    windows: tuple[tuple[float, float], ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class CaptureMark:
    """The window a profiler trace captured (Unix seconds), drawn so its findings sit on the metrics."""

    start: float
    end: float
    label: str


def capture_shapes(
    captures: Sequence[CaptureMark], window: tuple[float, float] | None, span_s: float, points: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A dashed outline over every subplot for each capture window, labelled at the bottom with the file's
    name. Captures outside the shown window are left out; sub-pixel ones are widened to one pixel."""
    shapes: list[dict[str, Any]] = []
    labels: list[dict[str, Any]] = []
    pixel_s = span_s / max(points, 1) if span_s > 0 else 0.0
    for cap in captures[:MAX_SHAPES]:
        start, end = cap.start, max(cap.end, cap.start)
        if window is not None and (end < window[0] or start > window[1]):
            continue
        if end - start < pixel_s:
            mid = (start + end) / 2
            start, end = mid - pixel_s / 2, mid + pixel_s / 2
        shapes.append({
            "type": "rect", "xref": "x", "yref": "paper", "x0": round(start * 1000), "x1": round(end * 1000),
            "y0": 0, "y1": 1, "line": {"width": 1.5, "dash": "dash", "color": BLACK},
            "fillcolor": "rgba(0,0,0,0)", "layer": "above", "name": "capture",
        })  # fmt: skip
        labels.append({
            "x": round(start * 1000), "xref": "x", "y": 0, "yref": "paper", "yanchor": "top", "yshift": -18,
            "xanchor": "left", "text": f"trace: {escape(cap.label)[:60]}", "showarrow": False,
            "font": {"color": BLACK, "size": 11}, "name": "capture",
        })  # fmt: skip
    return shapes, labels


def ms(values: np.ndarray) -> list[int]:
    """Unix seconds -> integer Unix milliseconds (what Plotly reads on a date axis)."""
    return np.rint(np.asarray(values, dtype=np.float64) * 1000.0).astype(np.int64).tolist()


def rounded(values: np.ndarray, scale: float = 1.0, digits: int = 3) -> list[float | int | None]:
    """Scaled, rounded values for JSON, NaN -> None (a gap). digits=0 gives ints (shorter payload)."""
    arr = np.round(np.asarray(values, dtype=np.float64) * scale, digits)
    if digits == 0:
        return [None if v != v else int(v) for v in arr.tolist()]
    return [None if v != v else v for v in arr.tolist()]


def _rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _has_data(series: SignalSeries | None) -> bool:
    return series is not None and series.mean is not None and not np.isnan(series.mean).all()


def clamp_points(points: int | None) -> int:
    """A requested pixel budget within [MIN_POINTS, MAX_POINTS] (DEFAULT_POINTS when absent)."""
    if not points:
        return DEFAULT_POINTS
    return max(MIN_POINTS, min(MAX_POINTS, int(points)))


def _window_slice(ts: np.ndarray, window: tuple[float, float] | None) -> slice:
    if window is None:
        return slice(None)
    lo = int(np.searchsorted(ts, window[0], side="left"))
    hi = int(np.searchsorted(ts, window[1], side="right"))
    return slice(max(0, lo - 1), min(ts.size, hi + 1))  # one point beyond each edge: lines reach the border


def row_lines(row: Row, sigs: JobSignals | None) -> list[Line]:
    """The lines a row draws: its own, plus its fallback lines when the lines they stand in for have no
    data (NVLink total bandwidth when NVLink TX/RX bytes are not collected)."""
    if sigs is None or not row.fallback:
        return list(row.lines)
    if any(_has_data(sigs.get(key)) for key in row.fallback_for):
        return list(row.lines)
    return [line for line in row.lines if line.key not in row.fallback_for] + list(row.fallback)


def shown_rows(sigs: JobSignals | None) -> tuple[Row, ...]:
    """The GPU rows, then the host rows that have data (ROWS' indices are unchanged)."""
    if sigs is None:
        return ROWS
    return (*ROWS, *(r for r in HOST_ROWS if any(_has_data(sigs.get(line.key)) for line in r.lines)))


def missing_lines(sigs: JobSignals | None, reasons: Mapping[str, str]) -> list[dict[str, str]]:
    """Lines without data, with the reason (for the note under the chart): [{row, label, key, reason}]."""
    out = []
    for row in ROWS:
        shown = row_lines(row, sigs)
        for line in row.lines:
            if sigs is None or not _has_data(sigs.get(line.key)):
                reason = reasons.get(line.key) or "no data archived yet"
                if line not in shown:
                    reason += f" (the chart shows {row.fallback[0].label} instead)"
                out.append({"row": row.title, "label": line.label, "key": line.key, "reason": reason})
        for line in shown:
            if line not in row.lines and (sigs is None or not _has_data(sigs.get(line.key))):
                out.append({"row": row.title, "label": line.label, "key": line.key,
                            "reason": reasons.get(line.key) or "no data archived yet"})  # fmt: skip
    return out


def merge_windows(
    windows: Sequence[Sequence[float]], min_gap_s: float, limit: int = MAX_SHAPES
) -> list[tuple[float, float]]:
    """Sorted windows with overlaps and gaps shorter than `min_gap_s` merged; at most `limit` (the gap
    tolerance doubles until they fit, so a finding with thousands of short windows stays drawable)."""
    clean = sorted((float(w[0]), float(w[1])) for w in windows if len(w) == 2 and w[1] >= w[0])
    gap = max(min_gap_s, 0.0)
    while True:
        merged: list[tuple[float, float]] = []
        for start, end in clean:
            if merged and start - merged[-1][1] <= gap:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        if len(merged) <= limit or not merged:
            return merged
        gap = max(gap * 2, 1.0)


WHOLE_SPAN_SHARE = 0.9  # a finding whose windows cover this much of the shown span is "the whole job"


def covers_whole_span(windows: Sequence[Sequence[float]], span_s: float) -> bool:
    """Whether the windows (merged) cover most of the span: shading them would tint the whole chart, and
    zooming to them would show nothing new."""
    if span_s <= 0 or not windows:
        return False
    return sum(end - start for start, end in merge_windows(windows, 0.0)) >= WHOLE_SPAN_SHARE * span_s


def finding_shapes(
    marks: Sequence[FindingMark], span_s: float, points: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Shaded rectangles over every subplot for each finding window, and a numbered label over the first
    window of each finding (the number matches the findings list: colour is not the only cue). Findings
    that cover the whole span are not shaded: the list says "the whole job"."""
    shapes: list[dict[str, Any]] = []
    labels: list[dict[str, Any]] = []
    per = max(1, MAX_SHAPES // max(1, len(marks)))
    pixel_s = span_s / max(points, 1)
    for mark in marks:
        if covers_whole_span(mark.windows, span_s):
            continue
        merged = merge_windows(mark.windows, pixel_s, per)
        for start, end in merged:
            if end - start < pixel_s:  # keep sub-pixel windows visible
                mid = (start + end) / 2
                start, end = mid - pixel_s / 2, mid + pixel_s / 2
            shapes.append({
                "type": "rect", "xref": "x", "yref": "paper", "x0": round(start * 1000),
                "x1": round(end * 1000), "y0": 0, "y1": 1, "fillcolor": mark.colour, "opacity": 0.14,
                "line": {"width": 0}, "layer": "below", "name": f"finding:{mark.code}",
            })  # fmt: skip
        if merged:
            labels.append({
                "x": round(merged[0][0] * 1000), "xref": "x", "y": 1.0, "yref": "paper", "yanchor": "bottom",
                "yshift": 22,
                "xanchor": "left", "text": f"<b>{mark.number}</b>", "showarrow": False,
                "font": {"color": "#ffffff" if mark.colour in (BLUE, BLACK) else "#000000", "size": 11},
                "bgcolor": mark.colour, "borderpad": 2,
                "name": f"finding:{mark.code}",
            })  # fmt: skip
    return shapes, labels


def _hline(
    axis: int, value: float, text: str, *, under: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A dashed reference line and its label: above the line at the right, or (`under`: a second, lower line
    on the same chart, e.g. the peak's clock under the max boost clock) below it at the left, so two close
    lines' labels never overprint."""
    shape = {
        "type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": f"y{axis}", "y0": value, "y1": value,
        "line": {"color": GREY, "width": 1, "dash": "dash"}, "layer": "below",
    }  # fmt: skip
    label = {
        "xref": "paper", "x": 0 if under else 1, "xanchor": "left" if under else "right", "yref": f"y{axis}",
        "y": value, "yanchor": "top" if under else "bottom", "text": text, "showarrow": False,
        "font": {"color": GREY, "size": 11},
    }  # fmt: skip
    return shape, label


def timeseries_figure(
    sigs: JobSignals | None,
    *,
    points: int = DEFAULT_POINTS,
    findings: Sequence[FindingMark] = (),
    reasons: Mapping[str, str] | None = None,
    peak_clock_mhz: float | None = None,
    max_clock_mhz: float | None = None,
    memory_gib: float | None = None,
    target_mfu: float | None = None,
    window: tuple[float, float] | None = None,
    captures: Sequence[CaptureMark] = (),
) -> dict[str, Any]:
    """The job's correlated time series: one subplot per row of ROWS (then each of HOST_ROWS that has
    data), all on one shared date axis, with unified hover across subplots, finding windows shaded,
    reference lines (max boost and peak clocks, memory capacity, target MFU), the windows profiler traces
    captured, and a note in each GPU subplot that has no data. `window` (Unix s) limits the data to a
    zoom."""
    reasons = reasons or {}
    points = clamp_points(points)
    rows = shown_rows(sigs)
    n = len(rows)
    gap, height_per_row = 0.035, 118
    row_h = (1 - gap * (n - 1)) / n
    data: list[dict[str, Any]] = []
    layout: dict[str, Any] = {
        "height": height_per_row * n + 90,
        "margin": {"l": 64, "r": 16, "t": 56, "b": 40},
        "hovermode": "x unified",
        "hoversubplots": "axis",
        "dragmode": "zoom",
        "font": FONT,
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "showlegend": True,
        "xaxis": {
            "type": "date", "anchor": f"y{n}", "domain": [0, 1], "showspikes": True, "spikemode": "across",
            "spikethickness": 1, "spikecolor": GREY, "spikedash": "solid", "gridcolor": "#e6eaee",
            "hoverformat": "%Y-%m-%d %H:%M:%S UTC", **TICKS_UNMEASURED,
        },
        "shapes": [],
        "annotations": [],
    }  # fmt: skip
    shown = window or data_extent(sigs)
    span = (shown[1] - shown[0]) if shown else 0.0
    if shown and span > 0:
        layout["xaxis"]["range"] = [round(shown[0] * 1000), round(shown[1] * 1000)]
    for r, row in enumerate(rows, start=1):
        top = 1 - (r - 1) * (row_h + gap)
        axis_key = "yaxis" if r == 1 else f"yaxis{r}"
        axis: dict[str, Any] = {
            "domain": [round(top - row_h, 4), round(top, 4)], "anchor": "x", "fixedrange": True,
            "title": {"text": row.unit, "standoff": 4}, "gridcolor": "#e6eaee", "zeroline": False,
            "rangemode": "tozero", **TICKS_UNMEASURED,
        }  # fmt: skip
        if row.percent:
            axis["range"] = [0, 105]
        layout[axis_key] = axis
        legend = "legend" if r == 1 else f"legend{r}"
        layout[legend] = {
            "x": 0, "xref": "paper", "xanchor": "left", "y": round(top, 4), "yref": "paper",
            "yanchor": "bottom", "orientation": "h", "bgcolor": "rgba(255,255,255,0.85)",
            "font": {"size": 11}, "itemclick": "toggle",
            "title": {"text": f"<b>{row.title}</b> ({row.unit})", "side": "left"},
        }  # fmt: skip
        drawn = 0
        for line in row_lines(row, sigs):
            series = sigs.get(line.key) if sigs is not None else None
            if not _has_data(series):
                continue
            assert series is not None and series.mean is not None
            part = _window_slice(series.timestamps, window)
            lx, ly, env = downsample_line(series.timestamps[part], series.mean[part], points)
            buckets = max(1, points // ENVELOPE_POINTS_PER_BUCKET)
            low, high = series.stats.get(MEAN_LOW), series.stats.get(MEAN_HIGH)
            if low is not None and high is not None:
                # A pre-downsampled level (the whole-job view of a long job): its means average short dips
                # away, so the envelope is of each window's lowest and highest polled mean instead.
                env = envelope_between(series.timestamps[part], low[part], high[part], buckets)
            elif env is not None:
                env = envelope(series.timestamps[part], series.mean[part], buckets)
            common = {"xaxis": "x", "yaxis": f"y{r}", "legendgroup": line.key, "legend": legend}
            if env is not None:
                data.append({
                    "type": "scatter", "mode": "lines", "name": f"{line.label} range",
                    "x": ms(np.concatenate((env.x, env.x[::-1]))),
                    "y": rounded(np.concatenate((env.high, env.low[::-1])), row.scale, row.digits),
                    "fill": "toself", "fillcolor": _rgba(line.colour, 0.16), "line": {"width": 0},
                    "hoverinfo": "skip", "showlegend": False, **common,
                })  # fmt: skip
            data.append({
                "type": "scatter", "mode": "lines", "name": line.label, "x": ms(lx),
                "y": rounded(ly, row.scale, row.digits), "connectgaps": False,
                "line": {"color": line.colour, "width": 1.6, "dash": line.dash},
                "hovertemplate": f"%{{y:,.{row.digits}f}} {row.unit}", **common,
            })  # fmt: skip
            drawn += 1
        if drawn == 0:
            missing = [f"{line.label}: {reasons.get(line.key) or 'no data'}" for line in row_lines(row, sigs)]
            layout["annotations"].append({
                "xref": "paper", "x": 0.5, "yref": f"y{r} domain", "y": 0.5, "showarrow": False,
                "text": "No data. " + escape(missing[0])[:160], "font": {"color": GREY, "size": 12},
            })  # fmt: skip
    _reference_lines(layout, (peak_clock_mhz, max_clock_mhz), memory_gib, target_mfu, sigs)
    shapes, labels = finding_shapes(findings, span, points)
    layout["shapes"] += shapes
    layout["annotations"] += labels
    shapes, labels = capture_shapes(captures, window, span, points)
    layout["shapes"] += shapes
    layout["annotations"] += labels
    return {"data": data, "layout": layout}


def data_extent(sigs: JobSignals | None) -> tuple[float, float] | None:
    """First and last time any charted signal has a sample (archive chunks are aligned to the clock, so
    the grid can start hours before the job)."""
    if sigs is None:
        return None
    present = np.zeros(sigs.timestamps.shape, dtype=bool)
    for key in CHART_SIGNALS:
        series = sigs.get(key)
        if series is not None and series.mean is not None:
            present |= ~np.isnan(series.mean)
    if not present.any():
        return None
    idx = np.flatnonzero(present)
    return float(sigs.timestamps[idx[0]]), float(sigs.timestamps[idx[-1]])


def _row_index(title: str) -> int:
    return next(i for i, row in enumerate(ROWS, start=1) if row.title == title)


def _reference_lines(
    layout: dict[str, Any],
    clocks: tuple[float | None, float | None],
    memory_gib: float | None,
    target_mfu: float | None,
    sigs: JobSignals | None,
) -> None:
    refs: list[tuple[int, float, str]] = []
    # Two clocks, two jobs (reference/gpus.md): throttling is judged against the max boost clock, the MFU
    # cross-check scales by the clock the quoted peak assumes (H100 SXM: 1,980 vs 1,830 MHz).
    peak_clock, max_clock = clocks
    if max_clock:
        text = f"max boost {max_clock:,.0f} MHz (throttling reference)"
        refs.append((_row_index("SM clock"), float(max_clock), text))
    if peak_clock and peak_clock != max_clock:
        text = f"peak's clock {peak_clock:,.0f} MHz (MFU cross-check)"
        refs.append((_row_index("SM clock"), float(peak_clock), text))
    capacity = memory_gib
    used = sigs.get("fb_used") if sigs is not None else None
    free = sigs.get("fb_free") if sigs is not None else None
    if capacity is None and used is not None and free is not None and _has_data(used) and _has_data(free):
        assert used.mean is not None and free.mean is not None
        capacity = float(np.nanmedian(used.mean + free.mean)) / 1024
    if capacity and math.isfinite(capacity):
        refs.append((_row_index("Memory"), capacity, f"capacity {capacity:,.0f} GiB"))
    if target_mfu:
        refs.append((_row_index("MFU"), target_mfu * 100, f"target {target_mfu:.0%}"))
    for axis, value, text in refs:
        # A lower line on an axis that has a higher one gets its label under it (no overprint).
        under = any(a == axis and v > value for a, v, _ in refs)
        shape, label = _hline(axis, value, text, under=under)
        layout["shapes"].append(shape)
        layout["annotations"].append(label)
        # Keep the reference line inside the visible range.
        key = "yaxis" if axis == 1 else f"yaxis{axis}"
        layout[key].setdefault("rangemode", "tozero")
        layout[key]["autorangeoptions"] = {"include": [0, value * 1.05]}


# ------------------------------------------------------------------------------------------ sparkline


def sparkline_points(
    values: Sequence[float | None], width: float = 96, height: float = 24, vmax: float | None = None
) -> list[str]:
    """SVG polyline `points` strings (one per unbroken run; None breaks the line) for a tiny trend chart
    drawn server-side: no script needed. y = 0 at the bottom, `vmax` (default: the largest value) on top."""
    present = [v for v in values if v is not None and math.isfinite(v)]
    if not present:
        return []
    top = vmax if vmax else max(present) or 1.0
    step = width / max(len(values) - 1, 1)
    runs: list[list[str]] = [[]]
    for i, value in enumerate(values):
        if value is None or not math.isfinite(value):
            if runs[-1]:
                runs.append([])
            continue
        y = height - 1 - (height - 2) * max(0.0, min(1.0, value / top))
        runs[-1].append(f"{i * step:.1f},{y:.1f}")
    # A single point draws nothing as a polyline: widen it into a short tick.
    return [" ".join(run) if len(run) > 1 else _tick(run[0]) for run in runs if run]


def _tick(point: str) -> str:
    x, y = (float(v) for v in point.split(","))
    return f"{x - 2:.1f},{y:.1f} {x + 2:.1f},{y:.1f}"
