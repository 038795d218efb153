"""What the job page's figures leave out to draw fast (issue 15, the cold load), and what they keep."""

from __future__ import annotations

import numpy as np

from jobs import charts
from jobs.metrics.signals import GpuKey, JobSignals, SignalSeries

DAY = 86_400.0


def week_of(key: str, values: np.ndarray, step: float = 30.0) -> JobSignals:
    """A JobSignals with one signal (`key`) sampled every `step` seconds."""
    start = 1.7e9
    ts = start + step * np.arange(values.size)
    sigs = JobSignals(start, float(ts[-1]), step, ts)
    sigs.signals[key] = SignalSeries(key, "", ts, {"mean": values})
    return sigs


def trace(fig: dict, name: str) -> dict:
    return next(t for t in fig["data"] if t["name"] == name)


def test_the_envelope_still_shows_a_one_sample_spike_the_line_drops() -> None:
    # A week at 30 s is 20,160 samples; 1,000 line points keep about one in 20. One sample of 100 % in a
    # flat 40 % (sm_active is a ratio: 1.0 is 100 % on the chart).
    values = np.full(20_160, 0.4)
    values[10_001] = 1.0
    fig = charts.timeseries_figure(week_of("sm_active", values), points=1000)
    line = trace(fig, "SM active")
    band = trace(fig, "SM active range")
    assert band["fill"] == "toself" and band["hoverinfo"] == "skip"
    assert max(v for v in band["y"] if v is not None) == 100.0  # the spike, in %
    assert min(v for v in band["y"] if v is not None) == 40.0
    # The band's top reaches 100 % at the spike's time: the bucket holding sample 10,001 spans it.
    spike_ms = round((1.7e9 + 30.0 * 10_001) * 1000)
    half = len(band["x"]) // 2
    tops = [(x, y) for x, y in zip(band["x"][:half], band["y"][:half], strict=True) if y == 100.0]
    assert len(tops) == 1 and abs(tops[0][0] - spike_ms) <= 20_160 / 250 * 30_000 / 2
    assert len(line["x"]) == 1000


def test_the_envelope_has_a_bucket_per_four_line_points() -> None:
    # 1,000 points -> 250 buckets; the polygon goes along the highs and back along the lows: 500 vertices.
    rng = np.random.default_rng(3)
    fig = charts.timeseries_figure(week_of("sm_active", 0.5 + 0.1 * rng.standard_normal(20_160)), points=1000)
    band = trace(fig, "SM active range")
    assert len(band["x"]) == len(band["y"]) == 2 * 1000 // 4
    assert band["x"][:250] == band["x"][250:][::-1]


def test_unthinned_lines_still_have_no_envelope() -> None:
    fig = charts.timeseries_figure(week_of("sm_active", np.full(300, 0.5)), points=1000)
    assert [t["name"] for t in fig["data"]] == ["SM active"]


def test_tick_labels_are_drawn_without_measuring_each_for_overflow() -> None:
    rng = np.random.default_rng(4)
    sigs = week_of("sm_active", 0.5 + 0.1 * rng.standard_normal(2_000))
    layout = charts.timeseries_figure(sigs)["layout"]
    axes = [k for k in layout if k.startswith(("xaxis", "yaxis"))]
    assert len(axes) == 1 + len(charts.ROWS)
    assert all(layout[k]["ticklabeloverflow"] == "allow" for k in axes)
    series = sigs.get("sm_active")
    assert series is not None
    series.gpus = tuple(GpuKey("node-0", str(i)) for i in range(3))
    series.gpu_timestamps = sigs.timestamps
    series.per_gpu = np.full((3, sigs.timestamps.size), 0.5)
    heat = charts.heatmap_figure(series, "SM active")
    assert heat is not None
    assert {heat["layout"][k]["ticklabeloverflow"] for k in ("xaxis", "yaxis")} == {"allow"}
    # The colour bar stays in the figure (the page draws it in HTML; other pages may use plotly's).
    assert heat["data"][0]["colorbar"]["title"]["text"] == "SM active, %"
