"""Figures of the comparison page: two runs' signals overlaid on one relative time axis (hours since each
run started) and their per-GPU means side by side. Pure: no Django.

Same conventions as jobs.charts.timeseries: every axis names its unit, lines are downsampled to a pixel
budget, a missing signal is a note in its subplot (never a line at 0), text from users is escaped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from jobs.charts.common import BLUE, FONT, GREY, VERMILLION, escape
from jobs.charts.timeseries import DEFAULT_POINTS, clamp_points, rounded
from jobs.metrics.downsample import downsample_line

#: Run A ("before") and run B ("after"): colour and dash, so the two differ without colour too.
STYLE = {"a": (VERMILLION, "dash"), "b": (BLUE, "solid")}


@dataclass(frozen=True, slots=True)
class OverlayRow:
    """One subplot: a series key, its title, the unit on the y axis and how values convert to it."""

    key: str
    title: str
    unit: str
    scale: float
    digits: int
    percent: bool = False


OVERLAY_ROWS: tuple[OverlayRow, ...] = (
    OverlayRow("mfu", "MFU", "%", 100.0, 1, True),
    OverlayRow("tokens_per_second_per_gpu", "Tokens/s per GPU", "tokens/s", 1.0, 0),
    OverlayRow("sm_active", "SM active", "%", 100.0, 1, True),
    OverlayRow("tensor_active", "Tensor active", "%", 100.0, 1, True),
    OverlayRow("gpu_util", "nvidia-smi util", "%", 100.0, 1, True),
    OverlayRow("dram_active", "DRAM active", "%", 100.0, 1, True),
    OverlayRow("power_usage", "Board power (mean per GPU)", "W", 1.0, 0),
    OverlayRow("sm_clock", "SM clock", "MHz", 1.0, 0),
    OverlayRow("fb_used", "Frame buffer used (mean per GPU)", "GiB", 1 / 1024, 2),
)

#: A run's series for the overlay: key -> (seconds since the run started, values in the signal's unit).
Series = Mapping[str, tuple[np.ndarray, np.ndarray]]


def _has(series: Series, key: str) -> bool:
    pair = series.get(key)
    return pair is not None and bool(np.isfinite(pair[1]).any())


def overlay_figure(
    a: Series, b: Series, labels: tuple[str, str], *, points: int = DEFAULT_POINTS
) -> dict[str, Any]:
    """One subplot per OVERLAY_ROWS entry with data in either run, all on one shared x axis in hours since
    each run's start, run A and run B in every subplot (unified hover across subplots). Rows without data
    in either run are not drawn; `missing` names them (the page lists them under the chart)."""
    points = clamp_points(points)
    rows = [row for row in OVERLAY_ROWS if _has(a, row.key) or _has(b, row.key)]
    missing = [row.title for row in OVERLAY_ROWS if row not in rows]
    n = max(len(rows), 1)
    gap, row_h_px = 0.04, 120
    row_h = (1 - gap * (n - 1)) / n
    data: list[dict[str, Any]] = []
    layout: dict[str, Any] = {
        "height": row_h_px * n + 110,
        "margin": {"l": 64, "r": 16, "t": 40, "b": 48},
        "hovermode": "x unified",
        "hoversubplots": "axis",
        "font": FONT,
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "legend": {
            "orientation": "h",
            "x": 1,
            "xanchor": "right",
            "y": 1.0,
            "yanchor": "bottom",
            "yref": "paper",
        },
        "xaxis": {
            "type": "linear",
            "anchor": "y" if n == 1 else f"y{n}",
            "domain": [0, 1],
            "title": {"text": "hours since the run started"},
            "showspikes": True,
            "spikemode": "across",
            "spikethickness": 1,
            "spikecolor": GREY,
            "gridcolor": "#e6eaee",
            "hoverformat": ".2f",
            "rangemode": "tozero",
        },
        "annotations": [],
    }
    if not rows:
        layout["yaxis"] = {"visible": False}
        layout["annotations"].append(
            {
                "xref": "paper",
                "x": 0.5,
                "yref": "paper",
                "y": 0.5,
                "showarrow": False,
                "text": "No archived signals in either run",
                "font": {"color": GREY, "size": 12},
            }
        )
    legend_shown: set[str] = set()
    names = {"a": f"A (before): {escape(labels[0])}"[:90], "b": f"B (after): {escape(labels[1])}"[:90]}
    for r, row in enumerate(rows, start=1):
        axis_id = "y" if r == 1 else f"y{r}"
        top = 1 - (r - 1) * (row_h + gap)
        axis: dict[str, Any] = {
            "domain": [round(max(top - row_h, 0.0), 4), round(top, 4)],
            "anchor": "x",
            "fixedrange": True,
            "title": {"text": row.unit, "standoff": 4},
            "gridcolor": "#e6eaee",
            "zeroline": False,
            "rangemode": "tozero",
        }
        if row.percent:
            axis["range"] = [0, 105]
        layout["yaxis" if r == 1 else f"yaxis{r}"] = axis
        layout["annotations"].append(
            {
                "xref": "paper",
                "x": 0,
                "xanchor": "left",
                "yref": "paper",
                "y": round(top, 4),
                "yanchor": "bottom",
                "text": f"<b>{row.title}</b> ({row.unit})",
                "showarrow": False,
                "font": {"size": 11},
            }
        )
        for run, series in (("a", a), ("b", b)):
            if not _has(series, row.key):
                continue
            x, y = series[row.key]
            lx, ly, _ = downsample_line(x / 3600.0, y, points)
            colour, dash = STYLE[run]
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": names[run],
                    "x": rounded(lx, 1.0, 4),
                    "y": rounded(ly, row.scale, row.digits),
                    "xaxis": "x",
                    "yaxis": axis_id,
                    "connectgaps": False,
                    "line": {"color": colour, "width": 1.6, "dash": dash},
                    "legendgroup": run,
                    "showlegend": run not in legend_shown,
                    "hovertemplate": f"%{{y:,.{row.digits}f}} {row.unit}",
                    "meta": {"run": run, "key": row.key},
                }
            )
            legend_shown.add(run)
    return {"data": data, "layout": layout, "missing": missing}


def per_gpu_figure(
    label: str,
    a: tuple[Sequence[str], Sequence[float | None]],
    b: tuple[Sequence[str], Sequence[float | None]],
) -> dict[str, Any] | None:
    """Each GPU's time-mean of one ratio signal (%), run A and run B side by side (GPUs in host/index
    order; position n is each run's n-th GPU, its name in the hover). None when neither run has per-GPU
    data."""
    data = []
    for run, (gpus, means) in (("a", a), ("b", b)):
        if not gpus:
            continue
        colour, _ = STYLE[run]
        values = [None if m is None or m != m else round(m * 100, 1) for m in means]
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "A (before)" if run == "a" else "B (after)",
                "x": list(range(1, len(gpus) + 1)),
                "y": values,
                "text": [escape(g) for g in gpus],
                "marker": {"color": colour, "size": 8, "symbol": "circle-open" if run == "a" else "circle"},
                "hovertemplate": f"%{{text}}: %{{y:.1f}} % {escape(label)}<extra></extra>",
                "meta": {"run": run},
            }
        )
    if not data:
        return None
    return {
        "data": data,
        "layout": {
            "height": 300,
            "margin": {"l": 64, "r": 16, "t": 24, "b": 48},
            "font": FONT,
            "paper_bgcolor": "#ffffff",
            "plot_bgcolor": "#ffffff",
            "legend": {"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"},
            "xaxis": {"title": {"text": "GPU (host/index order)"}, "dtick": 1, "gridcolor": "#e6eaee"},
            "yaxis": {
                "title": {"text": f"{escape(label)}, % (time-mean)"},
                "range": [0, 105],
                "fixedrange": True,
                "gridcolor": "#e6eaee",
            },
        },
    }
