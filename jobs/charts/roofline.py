"""The job page's roofline figure: the GPU's memory and compute roofs on log axes, the job's mean, each
GPU's time-mean and the job over time (jobs.evaluation.roofline), as a plotly figure dict."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from jobs.charts.common import BLACK, BLUE, FONT, GREY, SKY, VERMILLION, escape
from jobs.evaluation.roofline import PIPE_LABELS, Placement, Roofline


def placed(p: Placement) -> bool:
    """A placement that has a point on log axes: a finite, positive intensity and FLOP/s."""
    return (
        p.intensity is not None
        and p.flops_per_s is not None
        and math.isfinite(p.intensity)
        and p.intensity > 0
        and p.flops_per_s > 0
    )


def _hover(p: Placement, title: str) -> str:
    pipe = PIPE_LABELS.get(p.busiest_pipe or "", "?")
    compute = f"{p.compute_share:.0%}" if p.compute_share is not None else "unknown"
    memory = f"{p.memory_share:.0%}" if p.memory_share is not None else "unknown"
    return (
        f"{title}<br>busiest pipe ({pipe}) {compute} of cycles, DRAM {memory}<br>"
        f"≤ {(p.flops_per_s or 0) / 1e12:,.1f} TFLOP/s, {p.intensity or 0:,.1f} FLOP/byte"
    )


def _points(
    items: list[tuple[Placement, str]], name: str, colour: str, symbol: str, size: int
) -> dict[str, Any]:
    return {
        "type": "scatter",
        "mode": "markers",
        "name": name,
        "x": [p.intensity for p, _ in items],
        "y": [(p.flops_per_s or 0) / 1e12 for p, _ in items],
        "text": [_hover(p, title) for p, title in items],
        "hovertemplate": "%{text}<extra></extra>",
        "marker": {"color": colour, "symbol": symbol, "size": size, "line": {"color": BLACK, "width": 1}},
    }


def roofline_figure(r: Roofline) -> dict[str, Any] | None:
    """The figure, or None when a roof or every point is unknown (the page says why in words)."""
    peak, bandwidth, ridge = r.roofs.peak_flops, r.roofs.bandwidth_bytes_per_s, r.roofs.ridge
    if peak is None or bandwidth is None or ridge is None:
        return None
    times = [(p, datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")) for t, p in r.over_time]
    over_time = [(p, title) for p, title in times if placed(p)]
    gpus = [(p, escape(p.label)) for p in r.gpus if placed(p)]
    job = [(r.job, "job mean")] if placed(r.job) else []
    everything = [p for p, _ in (*over_time, *gpus, *job)]
    if not everything:
        return None
    xs = [p.intensity for p in everything if p.intensity is not None]
    # The roofs from well left of the points and the ridge to well right of them: decades, so the roofs'
    # bend is always in view.
    x_lo = 10 ** math.floor(math.log10(min(min(xs), ridge) / 10))
    x_hi = 10 ** math.ceil(math.log10(max(max(xs), ridge) * 10))
    peak_t = peak / 1e12
    data: list[dict[str, Any]] = [
        {
            "type": "scatter", "mode": "lines", "name": f"memory roof ({bandwidth / 1e12:g} TB/s)",
            "x": [x_lo, ridge], "y": [x_lo * bandwidth / 1e12, peak_t],
            "line": {"color": GREY, "width": 2, "dash": "dash"}, "hoverinfo": "skip",
        },
        {
            "type": "scatter", "mode": "lines",
            "name": f"compute roof ({peak_t:g} TFLOP/s dense {r.roofs.dtype})",
            "x": [ridge, x_hi], "y": [peak_t, peak_t],
            "line": {"color": BLACK, "width": 2}, "hoverinfo": "skip",
        },
    ]  # fmt: skip
    if over_time:
        data.append(_points(over_time, "job over time (cross-GPU mean)", SKY, "circle", 6))
    if gpus:
        data.append(_points(gpus, "each GPU (time-mean)", BLUE, "diamond", 8))
    if job:
        data.append(_points(job, "job mean", VERMILLION, "star", 14))
    lowest = min(p.flops_per_s for p in everything if p.flops_per_s is not None) / 1e12
    y_lo = 10 ** math.floor(math.log10(lowest / 2))
    return {
        "data": data,
        "layout": {
            "height": 380, "margin": {"l": 70, "r": 16, "t": 24, "b": 50}, "font": FONT,
            "paper_bgcolor": "#ffffff", "plot_bgcolor": "#ffffff", "showlegend": True,
            "legend": {"orientation": "h", "y": -0.25},
            "xaxis": {"type": "log", "title": {"text": "estimated arithmetic intensity (FLOP/byte)"},
                      "range": [math.log10(x_lo), math.log10(x_hi)]},
            "yaxis": {"type": "log", "title": {"text": "TFLOP/s (activity-based upper estimate)"},
                      "range": [math.log10(y_lo), math.log10(peak_t * 2)]},
            "annotations": [{"x": math.log10(ridge), "y": math.log10(peak_t), "xref": "x", "yref": "y",
                             "text": f"ridge {ridge:,.0f} FLOP/byte", "showarrow": True, "ay": -24,
                             "font": {"size": 11}}],
        },
    }  # fmt: skip
