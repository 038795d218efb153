"""Plotly figures as plain dicts, built in Python and drawn by one static script per page. Pure: no Django.

Every axis names its unit; every trace is downsampled to a pixel budget (jobs.metrics.downsample) with a
min/max
envelope wherever thinning could hide a spike; missing signals stay missing (a note in the chart, never a
line at 0). Times go to the browser as Unix milliseconds (Plotly's native date number).

- jobs.charts.common: palette (Okabe-Ito), font, escaping of text from users and traces;
- jobs.charts.timeseries: the job's correlated time series, finding bands, sparklines;
- jobs.charts.per_gpu: the per-GPU heatmap, the peers' band (stragglers), the per-GPU table;
- jobs.charts.analyses: artifact analyses (breakdown bars, icicle flame graph).
"""

from jobs.charts.analyses import (
    PYSPY_CLASS_COLOURS,
    icicle_figure,
    pyspy_classes_figure,
    step_breakdown_figure,
    trace_breakdown_figure,
)
from jobs.charts.common import (
    BLACK,
    BLUE,
    FINDING_COLOURS,
    FONT,
    GREEN,
    GREY,
    ORANGE,
    PURPLE,
    SKY,
    VERMILLION,
    YELLOW,
    escape,
)
from jobs.charts.per_gpu import (
    GpuOutlier,
    GpuRow,
    GpuTable,
    colour_range,
    gpu_outliers,
    gpu_table,
    heatmap_figure,
)
from jobs.charts.timeseries import (
    CHART_SIGNALS,
    DEFAULT_POINTS,
    HEATMAP_COLUMNS,
    HOST_ROWS,
    MAX_POINTS,
    MAX_SHAPES,
    MIN_POINTS,
    ROWS,
    CaptureMark,
    FindingMark,
    Line,
    Row,
    capture_shapes,
    clamp_points,
    covers_whole_span,
    data_extent,
    finding_shapes,
    merge_windows,
    missing_lines,
    ms,
    rounded,
    row_lines,
    sparkline_points,
    timeseries_figure,
)

__all__ = [
    "BLACK",
    "BLUE",
    "CHART_SIGNALS",
    "DEFAULT_POINTS",
    "FINDING_COLOURS",
    "FONT",
    "GREEN",
    "GREY",
    "HEATMAP_COLUMNS",
    "HOST_ROWS",
    "MAX_POINTS",
    "MAX_SHAPES",
    "MIN_POINTS",
    "ORANGE",
    "PURPLE",
    "PYSPY_CLASS_COLOURS",
    "ROWS",
    "SKY",
    "VERMILLION",
    "YELLOW",
    "CaptureMark",
    "FindingMark",
    "GpuOutlier",
    "GpuRow",
    "GpuTable",
    "Line",
    "Row",
    "capture_shapes",
    "clamp_points",
    "colour_range",
    "covers_whole_span",
    "data_extent",
    "escape",
    "finding_shapes",
    "gpu_outliers",
    "gpu_table",
    "heatmap_figure",
    "icicle_figure",
    "merge_windows",
    "missing_lines",
    "ms",
    "pyspy_classes_figure",
    "rounded",
    "row_lines",
    "sparkline_points",
    "step_breakdown_figure",
    "timeseries_figure",
    "trace_breakdown_figure",
]
