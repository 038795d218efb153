"""Figures of artifact analyses: HTA breakdown bars per rank, step breakdown, py-spy icicle and classes.
Pure: no Django. Frame and rank names are escaped (jobs.charts.common.escape).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from jobs.charts.common import BLUE, FONT, GREEN, GREY, ORANGE, PURPLE, SKY, VERMILLION, YELLOW, escape
from jobs.profiling.schema.pyspy import PySpyAnalysis
from jobs.profiling.schema.trace import StepBreakdown, TemporalBreakdown, decode_trace

B = TypeVar("B")
#: A stacked bar: its name, colour and the typed read of its percentage from a decoded block.
Part = tuple[str, str, Callable[[B], float | None]]

_BREAKDOWN: tuple[Part[TemporalBreakdown], ...] = (
    ("Compute", BLUE, lambda t: t.compute_pct),
    ("Non-compute (comm, memcpy…)", ORANGE, lambda t: t.non_compute_pct),
    ("Idle", GREY, lambda t: t.idle_pct),
)
_STEP_PARTS: tuple[Part[StepBreakdown], ...] = (
    ("Kernels", BLUE, lambda s: s.kernel_pct),
    ("Communication", ORANGE, lambda s: s.communication_pct),
    ("Memcpy", SKY, lambda s: s.memcpy_pct),
    ("Memset", YELLOW, lambda s: s.memset_pct),
    ("CUDA runtime", PURPLE, lambda s: s.runtime_pct),
    ("DataLoader", VERMILLION, lambda s: s.dataloader_pct),
    ("CPU ops", GREEN, lambda s: s.cpu_exec_pct),
    ("Other", GREY, lambda s: s.other_pct),
)
PYSPY_CLASS_COLOURS = {
    "data_loading": VERMILLION, "tokenization": ORANGE, "collate": YELLOW, "framework": BLUE,
    "stdlib": SKY, "user_code": GREEN, "other": "#c9d1d9", "": "#e6eaee",
}  # fmt: skip
MAX_BAR_RANKS = 64


def _stacked_bars(rows: Sequence[tuple[str, B]], parts: Sequence[Part[B]], title: str) -> dict[str, Any]:
    # Every part is a percentage of the same whole, so the bars stack to 100.
    labels = [escape(label) for label, _ in rows]
    data = [
        {
            "type": "bar", "orientation": "h", "name": name, "y": labels,
            "x": [None if (v := read(section)) is None else round(v, 2) for _, section in rows],
            "marker": {"color": colour}, "hovertemplate": f"{name}: %{{x:.1f}} %<extra>%{{y}}</extra>",
        }
        for name, colour, read in parts
    ]  # fmt: skip
    return {
        "data": data,
        "layout": {
            "barmode": "stack", "height": 90 + 26 * len(rows), "font": FONT, "paper_bgcolor": "#ffffff",
            "plot_bgcolor": "#ffffff", "margin": {"l": 80, "r": 16, "t": 30, "b": 36},
            "xaxis": {"range": [0, 100], "title": {"text": title}, "fixedrange": True},
            "yaxis": {"type": "category", "autorange": "reversed", "fixedrange": True},
            "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0},
        },
    }  # fmt: skip


def trace_breakdown_figure(analysis: Mapping[str, Any]) -> dict[str, Any] | None:
    """Per rank, HTA's temporal breakdown: compute, non-compute and idle as % of the GPU span."""
    measured = [r for r in decode_trace(analysis).ranks if r.temporal_breakdown.idle_pct is not None]
    ranks = measured[:MAX_BAR_RANKS]
    if not ranks:
        return None
    rows = [(r.name, r.temporal_breakdown) for r in ranks]
    return _stacked_bars(rows, _BREAKDOWN, "% of the GPU-busy span (first to last GPU op)")


def step_breakdown_figure(analysis: Mapping[str, Any]) -> dict[str, Any] | None:
    """Per rank, where a training step's time goes (TensorBoard plugin's step breakdown), % of step."""
    ranks = [r for r in decode_trace(analysis).ranks if r.step_breakdown.steps][:MAX_BAR_RANKS]
    if not ranks:
        return None
    rows = [(r.name, r.step_breakdown) for r in ranks]
    return _stacked_bars(rows, _STEP_PARTS, "% of step time")


def icicle_figure(profile: PySpyAnalysis) -> dict[str, Any] | None:
    """A py-spy profile as a Plotly icicle (a flame graph, root on top), coloured by frame class."""
    tree = profile.icicle
    ids, labels, parents, values = tree.ids, tree.labels, tree.parents, tree.values
    if not ids or not (len(ids) == len(labels) == len(parents) == len(values)):
        return None
    classes = tree.classes or [""] * len(ids)
    unit = "s" if profile.weight_unit == "seconds" else "samples"
    return {
        "data": [{
            "type": "icicle", "ids": [escape(i) for i in ids], "labels": [escape(label) for label in labels],
            "parents": [escape(p) for p in parents], "values": values,
            "branchvalues": tree.branchvalues or "total", "tiling": {"orientation": "v"},
            "marker": {"colors": [PYSPY_CLASS_COLOURS.get(c, "#e6eaee") for c in classes],
                       "line": {"width": 0.5, "color": "#ffffff"}},
            "customdata": [escape(c) for c in classes], "maxdepth": 12, "sort": False,
            "hovertemplate": f"%{{label}}<br>%{{value:,.2f}} {unit} · %{{percentRoot:.1%}} of all samples"
                             "<br>class: %{customdata}<extra></extra>",
            "textinfo": "label",
        }],
        "layout": {"height": 520, "margin": {"l": 4, "r": 4, "t": 4, "b": 4}, "font": FONT,
                   "paper_bgcolor": "#ffffff"},
    }  # fmt: skip


def pyspy_classes_figure(profile: PySpyAnalysis) -> dict[str, Any] | None:
    """Where the Python time went, by class (data loading, tokenisation, collate, framework, ...), in %."""
    shares = profile.classes_pct or {}
    if not shares:
        return None
    keys = [k for k in PYSPY_CLASS_COLOURS if k in shares]
    return {
        "data": [{
            "type": "bar", "orientation": "h", "y": [k.replace("_", " ") for k in keys],
            "x": [shares[k] for k in keys], "marker": {"color": [PYSPY_CLASS_COLOURS[k] for k in keys]},
            "hovertemplate": "%{y}: %{x:.1f} % of samples<extra></extra>",
        }],
        "layout": {
            "height": 60 + 26 * len(keys), "font": FONT, "paper_bgcolor": "#ffffff",
            "plot_bgcolor": "#ffffff", "margin": {"l": 100, "r": 16, "t": 8, "b": 36},
            "xaxis": {"range": [0, 100], "title": {"text": "% of samples"}, "fixedrange": True},
            "yaxis": {"autorange": "reversed", "fixedrange": True},
        },
    }  # fmt: skip
