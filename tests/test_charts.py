"""Pure tests of the figure builders (jobs.charts) and the downsampling (jobs.metrics.downsample): no
Django."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from jobs import charts
from jobs.metrics.downsample import bucket_mean, downsample_line, envelope, lttb, minmax_preselect
from jobs.metrics.signals import GpuKey, JobSignals, SignalSeries, grid
from jobs.profiling.schema.pyspy import decode_pyspy

DAY = 86400.0


def reference_lttb(x: list[float], y: list[float], threshold: int) -> list[int]:
    """Steinarsson's LTTB, written plainly, to check the vectorised one against."""
    n = len(x)
    every = (n - 2) / (threshold - 2)
    a, out = 0, [0]
    for i in range(threshold - 2):
        lo, hi = math.floor(i * every) + 1, math.floor((i + 1) * every) + 1
        nlo, nhi = hi, min(math.floor((i + 2) * every) + 1, n)
        cx, cy = sum(x[nlo:nhi]) / (nhi - nlo), sum(y[nlo:nhi]) / (nhi - nlo)
        best, pick = -1.0, lo
        for j in range(lo, hi):
            area = abs((x[a] - cx) * (y[j] - y[a]) - (x[a] - x[j]) * (cy - y[a]))
            if area > best:
                best, pick = area, j
        out.append(pick)
        a = pick
    return [*out, n - 1]


# -------------------------------------------------------------------------------------------- downsample


@pytest.mark.parametrize(("n", "threshold"), [(100, 10), (1000, 37), (2016, 1000), (20160, 1000), (5, 3)])
def test_lttb_picks_exactly_the_reference_points(n, threshold):
    rng = np.random.default_rng(n)
    x = 1.7e9 + 30.0 * np.arange(n)
    y = np.cumsum(rng.normal(size=n))
    lx, ly = lttb(x, y, threshold)
    idx = reference_lttb(list(x - x[0]), list(y), threshold)
    np.testing.assert_array_equal(lx, x[idx])
    np.testing.assert_array_equal(ly, y[idx])


def test_lttb_returns_short_series_unchanged_and_validates():
    x, y = np.arange(5.0), np.arange(5.0)
    lx, ly = lttb(x, y, 10)
    np.testing.assert_array_equal(lx, x)
    np.testing.assert_array_equal(ly, y)
    with pytest.raises(ValueError):
        lttb(x, y, 2)
    with pytest.raises(ValueError):
        lttb(x, y[:3], 3)


def test_missing_samples_stay_gaps_never_zero():
    x = np.arange(10_000.0)
    y = np.sin(x / 300)
    y[2000:5000] = np.nan  # the exporter was down
    lx, ly = lttb(x, y, 500)
    gap = (lx > 2100) & (lx < 4900)
    assert gap.any() and np.isnan(ly[gap]).all()
    assert not np.isnan(ly[~((lx >= 2000) & (lx < 5000))]).any()
    env = envelope(x, y, 100)
    inside = (env.x > 2100) & (env.x < 4900)
    assert np.isnan(env.low[inside]).all() and np.isnan(env.high[inside]).all()


def test_envelope_keeps_a_single_sample_spike_that_thinning_drops():
    x = np.arange(20_160.0) * 30
    y = np.full(x.size, 0.55)
    y[7777] = 0.02  # one 30 s idle sample in a week
    lx, _, env = downsample_line(x, y, 1000)
    assert lx.size <= 1000
    assert env is not None and env.low.min() == pytest.approx(0.02)
    assert env.x.size == 500


def test_short_lines_are_not_thinned_and_have_no_envelope():
    x, y = np.arange(300.0), np.ones(300)
    lx, _, env = downsample_line(x, y, 1000)
    assert lx.size == 300 and env is None


def test_minmax_preselection_keeps_extremes_and_endpoints():
    x = np.arange(1000.0)
    y = np.zeros(1000)
    y[10], y[500] = 5.0, -5.0
    keep = minmax_preselect(x, y, 50)
    assert {0, 10, 500, 999} <= set(keep.tolist())
    assert np.all(np.diff(keep) > 0)


def test_bucket_mean_ignores_missing_samples():
    m = np.array([[1.0, 3.0, np.nan, np.nan, 5.0, 7.0], [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]])
    edges, means = bucket_mean(m, 3)
    assert edges.tolist() == [0, 2, 4]
    np.testing.assert_array_equal(means[0], [2.0, np.nan, 6.0])
    np.testing.assert_array_equal(means[1], [2.0, 2.0, 2.0])


# ---------------------------------------------------------------------------------------- time series


def job_signals(
    points: int, step: float, gpus: int = 0, gpu_step: float = 300.0, missing=(), host: bool = False
) -> JobSignals:
    start = 1.7e9
    ts = grid(start, start + step * (points - 1), step)
    sigs = JobSignals(start, float(ts[-1]), step, ts)
    rng = np.random.default_rng(1)
    for key in charts.CHART_SIGNALS:
        if key in missing or (key.startswith("host_") and not host):  # node_exporter: only when asked
            continue
        level = {"power_usage": 500.0, "sm_clock": 1800.0, "fb_used": 60000.0, "fb_free": 21000.0,
                 "tokens_per_second": 2e6, "pcie_rx_bytes": 1e9}.get(key, 0.5)  # fmt: skip
        mean = level * (1 + 0.05 * rng.standard_normal(ts.size))
        series = SignalSeries(key, "", ts, {"mean": mean})
        if gpus and key == "sm_active":
            gts = grid(start, float(ts[-1]), gpu_step)
            series.gpus = tuple(GpuKey(f"node-{i // 8:03d}", str(i % 8)) for i in range(gpus))
            series.gpu_timestamps = gts
            series.per_gpu = 0.5 + 0.05 * rng.standard_normal((gpus, gts.size))
            series.per_gpu[5] -= 0.2
        sigs.signals[key] = series
    return sigs


def test_host_rows_follow_the_gpu_rows_only_for_a_job_with_node_exporter_data():
    plain = charts.timeseries_figure(job_signals(61, 30.0))["layout"]
    assert len([k for k in plain if k.startswith("yaxis")]) == len(charts.ROWS)
    assert not charts.missing_lines(job_signals(61, 30.0), {})  # no "no data" notes for host rows
    with_host = charts.timeseries_figure(job_signals(61, 30.0, host=True))
    layout = with_host["layout"]
    n = len(charts.ROWS)
    assert len([k for k in layout if k.startswith("yaxis")]) == n + len(charts.HOST_ROWS)
    assert (
        layout[f"yaxis{n + 1}"]["title"]["text"] == "%" and layout[f"yaxis{n + 2}"]["title"]["text"] == "GB/s"
    )
    busy = next(t for t in with_host["data"] if t["name"] == "CPU busy (mean per host)")
    assert busy["yaxis"] == f"y{n + 1}"
    assert 40 < np.nanmean([v for v in busy["y"] if v is not None]) < 60  # a 0.5 ratio shown in %
    # Only the CPU row has data: one host row.
    only_cpu = job_signals(61, 30.0, host=True, missing=[k for k in charts.CHART_SIGNALS if "bytes" in k])
    rows = [k for k in charts.timeseries_figure(only_cpu)["layout"] if k.startswith("yaxis")]
    assert len(rows) == n + 1


def test_one_shared_time_axis_with_unified_hover_and_units():
    fig = charts.timeseries_figure(
        job_signals(361, 30.0), target_mfu=0.45, peak_clock_mhz=1830, max_clock_mhz=1980
    )
    layout = fig["layout"]
    assert {t["xaxis"] for t in fig["data"]} == {"x"}
    assert layout["hovermode"] == "x unified" and layout["hoversubplots"] == "axis"
    assert layout["xaxis"]["type"] == "date"
    rows = [k for k in layout if k.startswith("yaxis")]
    assert len(rows) == len(charts.ROWS)
    for i, row in enumerate(charts.ROWS, start=1):
        axis = layout["yaxis" if i == 1 else f"yaxis{i}"]
        assert axis["title"]["text"] == row.unit
    sm = next(t for t in fig["data"] if t["name"] == "SM active")
    assert 30 < np.nanmean([v for v in sm["y"] if v is not None]) < 70  # ratios shown in %
    assert isinstance(sm["x"][0], int) and sm["x"][0] == 1_700_000_000_000
    texts = [a["text"] for a in layout["annotations"]]
    assert any("target 45%" in t for t in texts)
    assert any("max boost 1,980 MHz (throttling reference)" in t for t in texts)
    assert any("peak's clock 1,830 MHz (MFU cross-check)" in t for t in texts)
    # The two clock lines are 150 MHz apart: their labels sit on opposite sides and sides of their lines
    # (they overprinted: issue 28 item 10).
    boost = next(a for a in layout["annotations"] if a["text"].startswith("max boost"))
    peak = next(a for a in layout["annotations"] if a["text"].startswith("peak's clock"))
    assert (boost["xanchor"], boost["yanchor"]) == ("right", "bottom")
    assert (peak["xanchor"], peak["yanchor"]) == ("left", "top")
    json.dumps(fig)  # plain JSON types only


def test_a_missing_signal_is_a_note_not_a_flat_line():
    sigs = job_signals(100, 30.0, missing=("sm_active", "sm_clock"))
    reasons = {"sm_clock": "not collected although in the default counters"}
    fig = charts.timeseries_figure(sigs, reasons=reasons)
    names = {t["name"] for t in fig["data"]}
    assert "SM active" not in names and "SM clock" not in names
    note = [a["text"] for a in fig["layout"]["annotations"] if a["text"].startswith("No data")]
    assert note == ["No data. SM clock: not collected although in the default counters"]
    missing = charts.missing_lines(sigs, reasons)
    assert {m["key"] for m in missing} == {"sm_active", "sm_clock"}


def test_nvlink_total_only_when_tx_rx_are_absent():
    with_txrx = charts.timeseries_figure(job_signals(50, 30.0))
    assert "NVLink total (both directions)" not in {t["name"] for t in with_txrx["data"]}
    without = charts.timeseries_figure(job_signals(50, 30.0, missing=("nvlink_rx_bytes", "nvlink_tx_bytes")))
    assert "NVLink total (both directions)" in {t["name"] for t in without["data"]}


def test_zoom_window_returns_only_that_part_at_full_resolution():
    sigs = job_signals(20_160, 30.0)
    start = sigs.start + 3 * DAY
    fig = charts.timeseries_figure(sigs, window=(start, start + 3600))
    sm = next(t for t in fig["data"] if t["name"] == "SM active")
    assert len(sm["x"]) == 123  # 121 samples in the hour plus one beyond each edge
    assert fig["layout"]["xaxis"]["range"] == [round(start * 1000), round((start + 3600) * 1000)]


def test_finding_windows_are_shaded_numbered_and_bounded():
    t0 = 1.7e9
    marks = [
        charts.FindingMark("straggler", 1, "x", charts.VERMILLION, ((t0 + 100, t0 + 900),)),
        # thousands of 10-second windows: merged until they fit
        charts.FindingMark(
            "data_pipeline_stall",
            2,
            "y",
            charts.BLUE,
            tuple((t0 + 60.0 * k, t0 + 60.0 * k + 10) for k in range(5000)),  # merged until they fit
        ),
    ]
    shapes, labels = charts.finding_shapes(marks, span_s=5 * DAY, points=1000)
    assert len(shapes) <= charts.MAX_SHAPES
    assert {s["name"] for s in shapes} == {"finding:straggler", "finding:data_pipeline_stall"}
    assert all(s["yref"] == "paper" and s["y0"] == 0 and s["y1"] == 1 for s in shapes)
    assert [lab["text"] for lab in labels] == ["<b>1</b>", "<b>2</b>"]
    assert labels[0]["font"]["color"] == "#000000" and labels[1]["font"]["color"] == "#ffffff"


def test_a_finding_over_the_whole_span_is_not_shaded():
    t0 = 1.7e9
    whole = charts.FindingMark("straggler", 1, "x", charts.BLUE, ((t0, t0 + 0.95 * DAY),))
    part = charts.FindingMark("throttling", 2, "y", charts.VERMILLION, ((t0, t0 + 3600),))
    shapes, labels = charts.finding_shapes([whole, part], span_s=DAY, points=1000)
    assert {s["name"] for s in shapes} == {"finding:throttling"} and len(labels) == 1
    assert charts.covers_whole_span([[t0, t0 + DAY / 2], [t0 + DAY / 2, t0 + DAY]], DAY)
    assert not charts.covers_whole_span([], DAY)


def test_merge_windows_merges_overlaps_and_close_gaps():
    merged = charts.merge_windows([[10, 20], [15, 30], [31, 40], [100, 110], [5, 4]], min_gap_s=2)
    assert merged == [(10.0, 40.0), (100.0, 110.0)]


def test_a_256_gpu_week_fits_the_payload_budget():
    sigs = job_signals(20_160, 30.0, gpus=256, gpu_step=300.0)
    fig = charts.timeseries_figure(sigs, points=charts.DEFAULT_POINTS)
    heat = charts.heatmap_figure(sigs.get("sm_active"), "SM active")
    for trace in fig["data"]:
        assert len(trace["x"]) <= 2 * charts.DEFAULT_POINTS
    payload = len(json.dumps(fig, separators=(",", ":"))) + len(json.dumps(heat, separators=(",", ":")))
    assert payload < 1.5 * 1024 * 1024


# ---------------------------------------------------------------------------------- heatmap, outliers


def test_heatmap_is_gpu_by_time_in_percent_with_escaped_names():
    sigs = job_signals(2016, 300.0, gpus=16, gpu_step=1800.0)
    series = sigs.get("sm_active")
    series.gpus = (GpuKey("<script>alert(1)</script>", "0"), *series.gpus[1:])
    fig = charts.heatmap_figure(series, "SM active", columns=100)
    trace = fig["data"][0]
    assert trace["type"] == "heatmap" and len(trace["z"]) == 16 and len(trace["x"]) <= 100
    assert trace["y"][0] == "&lt;script&gt;alert(1)&lt;/script&gt;/0"
    assert 0 <= trace["zmin"] < trace["zmax"] <= 100 and trace["zmax"] - trace["zmin"] >= 20
    assert trace["colorscale"] == "Cividis"
    assert charts.heatmap_figure(None, "SM active") is None


def test_gpu_outliers_flag_the_straggler():
    series = job_signals(2016, 300.0, gpus=16, gpu_step=1800.0).get("sm_active")
    out = charts.gpu_outliers(series)
    assert out[0].gpu == "node-000/5" and out[0].below_band
    assert not out[1].below_band


def test_colour_range_widens_to_tens():
    assert charts.colour_range(np.array([55.0, 61.0, 72.0])) == (50, 80)
    assert charts.colour_range(np.array([np.nan])) == (0, 100)
    assert charts.colour_range(np.array([99.0, 100.0])) == (80, 100)


# ----------------------------------------------------------------------------- artifacts, sparklines


def test_icicle_from_a_pyspy_analysis_escapes_frame_names():
    analysis = {
        "weight_unit": "seconds",
        "icicle": {"ids": ["n0", "n1", "n2"], "labels": ["all", "<b>main</b> (x.py)", 'tok "fast"'],
                   "parents": ["", "n0", "n1"], "values": [3.0, 3.0, 1.0],
                   "classes": ["", "user_code", "tokenization"], "branchvalues": "total"},
    }  # fmt: skip
    trace = charts.icicle_figure(decode_pyspy(analysis))["data"][0]
    assert trace["type"] == "icicle" and trace["branchvalues"] == "total"
    assert trace["labels"][1] == "&lt;b&gt;main&lt;/b&gt; (x.py)" and trace["labels"][2] == 'tok "fast"'
    assert trace["marker"]["colors"][2] == charts.PYSPY_CLASS_COLOURS["tokenization"]
    lopsided = {"icicle": {"ids": ["a"], "labels": [], "parents": [], "values": []}}
    assert charts.icicle_figure(decode_pyspy(lopsided)) is None


def test_trace_breakdown_bars_per_rank():
    temporal = {"idle_pct": 10, "compute_pct": 70, "non_compute_pct": 20}
    step = {"steps": 3, "kernel_pct": 60, "communication_pct": 30, "other_pct": 10}
    analysis = {
        "ranks": [
            {"rank": 0, "label": "rank 0", "temporal_breakdown": temporal, "step_breakdown": step},
            {"rank": 1, "label": "rank 1", "temporal_breakdown": {"idle_pct": None}},
        ]
    }
    fig = charts.trace_breakdown_figure(analysis)
    assert [t["name"] for t in fig["data"]][:1] == ["Compute"] and fig["data"][0]["y"] == ["rank 0"]
    steps = charts.step_breakdown_figure(analysis)
    assert next(t for t in steps["data"] if t["name"] == "Communication")["x"] == [30.0]
    assert charts.trace_breakdown_figure({"ranks": []}) is None


def test_sparkline_breaks_at_missing_weeks_and_shows_single_points():
    runs = charts.sparkline_points([0.2, 0.4, None, 0.5], width=90, height=20, vmax=1.0)
    assert len(runs) == 2
    first = [tuple(map(float, p.split(","))) for p in runs[0].split()]
    assert first[0] == (0.0, pytest.approx(19 - 18 * 0.2)) and first[1][0] == 30.0
    assert runs[1].count(",") == 2  # one point drawn as a short tick
    assert charts.sparkline_points([None, None]) == []


def test_capture_outlines_are_widened_to_a_pixel_and_left_out_of_other_windows():
    from jobs.charts import CaptureMark, capture_shapes

    # A 2 s capture in a 1 h span drawn at 1,000 points: one pixel is 3.6 s, so it is widened around its
    # middle (1,001 s) to [999.2, 1,002.8] s.
    shapes, labels = capture_shapes([CaptureMark(1000.0, 1002.0, "t.json")], None, 3600.0, 1000)
    assert [(s["x0"], s["x1"]) for s in shapes] == [(999200, 1002800)]
    assert labels[0]["text"] == "trace: t.json"
    # Zoomed to a window that does not contain it: nothing drawn; a name with markup is escaped.
    assert capture_shapes([CaptureMark(1000.0, 1002.0, "x")], (2000.0, 3000.0), 1000.0, 1000) == ([], [])
    _, labels = capture_shapes([CaptureMark(0.0, 10.0, "<b>x</b>")], None, 10.0, 10)
    assert "<b>" not in labels[0]["text"]


def test_artifact_numbers_past_float_range_or_not_finite_render_as_text():
    from jobs.views.artifacts import _num

    assert _num(10**400) == "out of range"
    assert _num(float("nan")) == "—" and _num(float("inf")) == "—"
    assert _num(1234.5, "ms") == "1,234.5 ms"


def test_gpu_table_flags_only_gpus_below_the_peers_band():
    """Issue 28 item 9: healthy GPUs at 27.6 % against a 28.0 % median were bulleted like stragglers."""
    series = job_signals(2016, 300.0, gpus=16, gpu_step=1800.0).get("sm_active")
    table = charts.gpu_table(series)
    assert table is not None and table.shown_all and len(table.rows) == 16
    assert [r.gpu for r in table.rows if r.below_band] == ["node-000/5"]
    assert table.below == 1 and table.within == 15
    assert table.rows[0].gpu == "node-000/5"  # lowest mean first
    assert all(r.low <= r.mean <= r.high for r in table.rows)


def test_gpu_table_of_many_gpus_lists_the_flagged_and_the_ends():
    series = job_signals(2016, 300.0, gpus=64, gpu_step=1800.0).get("sm_active")
    table = charts.gpu_table(series, max_rows=32, ends=3)
    assert table is not None and not table.shown_all
    assert len(table.rows) <= 6 + table.below
    assert table.within + table.below == 64
