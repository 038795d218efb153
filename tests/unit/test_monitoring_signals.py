"""A parsed nvidia-smi log as evaluation signals; DCGM wins where both have samples (no database)."""

from __future__ import annotations

import numpy as np
import pytest

from jobs.evaluation.monitoring_signals import LOG_SOURCE, describe, log_signals, merge, pick_gpus
from jobs.metrics.signals import COUNT, MAX, MEAN, MIN, SAMPLED, JobSignals, SignalSeries, grid
from jobs.profiling.nvidia_smi import analyze_nvidia_smi

START = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC


def _smi(gpus: list[list[float]], interval_s: float = 10.0, t0: float = START) -> dict:
    """The analysis of an indexed nvidia-smi log: GPU g at `gpus[g][k]` % in sweep k (unix-second stamps)."""
    lines = ["timestamp, index, utilization.gpu [%], power.draw [W]"]
    for k in range(len(gpus[0])):
        for g, row in enumerate(gpus):
            lines.append(f"{t0 + interval_s * k:.3f}, {g}, {row[k]:g} %, {100 + row[k]:.1f} W")
    return analyze_nvidia_smi(("\n".join(lines) + "\n").encode())


def test_log_samples_land_in_the_grid_windows_they_close() -> None:
    # 2 GPUs, 10 s samples over 120 s; the evaluation grid is 30 s: window (t - 30, t].
    analysis = _smi([[50.0] * 13, [0.0] * 6 + [100.0] * 7])
    ts = grid(START, START + 120, 30.0)
    got = log_signals(analysis, ts, 30.0, start=START, end=START + 120, gpu_count=2)
    util = got.series["gpu_util"]
    assert got.interval_s == pytest.approx(10.0)
    # Window 0 is (START - 30, START]: only the first sweep (both GPUs, 0.5 and 0.0).
    assert util.stats[MEAN][0] == pytest.approx(0.25)
    assert util.stats[COUNT][0] == 2 and util.stats[MIN][0] == 0.0 and util.stats[MAX][0] == 0.5
    # Window 2 = (START + 30, START + 60]: samples at 40, 50, 60 s; GPU 1 reads 0 at 40, 50 and 100 at 60.
    assert util.stats[MEAN][2] == pytest.approx((0.5 + (0 + 0 + 1.0) / 3) / 2)
    # 3 samples of 10 s cover each of the 2 GPUs' 30 s window: 2 GPUs' worth.
    assert util.stats[SAMPLED][2] == pytest.approx(2.0)
    # Window 0 holds one 10 s sample per GPU (2 x 10/30); windows 1-4 are full: (2/3 + 4 x 2) / (2 x 5).
    assert util.coverage == pytest.approx((2 / 3 + 8) / 10)
    # Per GPU at the log's own 10 s resolution: 13 columns, exact idle cells.
    assert util.per_gpu is not None and util.per_gpu.shape == (2, 13)
    assert int((util.per_gpu <= 0.05).sum()) == 6
    assert got.series["power_usage"].stats[MAX][4] == pytest.approx(200.0)


def test_dcgm_wins_where_it_has_samples_and_the_log_fills_the_rest() -> None:
    ts = grid(START, START + 120, 30.0)
    n = ts.size
    count = np.array([2.0, 2.0, np.nan, np.nan, np.nan])
    dcgm = SignalSeries(
        "gpu_util",
        "ratio",
        ts,
        {MEAN: np.array([0.9, 0.9, np.nan, np.nan, np.nan]), MIN: np.full(n, 0.9), MAX: np.full(n, 0.9),
         COUNT: count, SAMPLED: np.array([2.0, 2.0, 0.0, 0.0, 0.0])},
    )  # fmt: skip
    sigs = JobSignals(START, START + 120, 30.0, ts, signals={"gpu_util": dcgm})
    analysis = _smi([[10.0] * 13, [10.0] * 13])
    got = log_signals(analysis, ts, 30.0, start=START, end=START + 120, gpu_count=2)
    merged, sources = merge(sigs, [("from the uploaded nvidia-smi log 'a.csv'", got)], start=START,
                            end=START + 120, step=30.0, ts=ts)  # fmt: skip
    assert merged is not None
    mean = merged.signals["gpu_util"].stats[MEAN]
    assert mean[:2].tolist() == [0.9, 0.9]  # DCGM's, although the log has samples there too
    assert mean[2:] == pytest.approx([0.1, 0.1, 0.1])  # the log's, where DCGM had none
    assert sources["gpu_util"].startswith("DCGM; 60% of the job's windows")
    # power: DCGM has none, so it is the log's alone.
    assert sources["power_usage"] == "from the uploaded nvidia-smi log 'a.csv'"
    assert merged.signals["power_usage"].per_gpu is not None


def test_two_logs_of_one_signal_are_not_blended_the_first_wins() -> None:
    ts = grid(START, START + 60, 30.0)
    newer = log_signals(_smi([[0.0] * 4]), ts, 30.0, start=START, end=START + 60, gpu_count=1)
    older = log_signals(_smi([[90.0] * 7]), ts, 30.0, start=START, end=START + 60, gpu_count=1)
    merged, sources = merge(None, [("new", newer), ("old", older)], start=START, end=START + 60, step=30.0,
                            ts=ts)  # fmt: skip
    assert merged is not None and sources["gpu_util"] == "new"
    # The newer log ends at 30 s; its empty last window is not filled from the older one.
    assert np.isnan(merged.signals["gpu_util"].stats[MEAN][2])


def test_without_dcgm_the_log_is_the_jobs_signals() -> None:
    ts = grid(START, START + 60, 30.0)
    got = log_signals(_smi([[0.0] * 7]), ts, 30.0, start=START, end=START + 60, gpu_count=1)
    merged, sources = merge(None, [("x", got)], start=START, end=START + 60, step=30.0, ts=ts)
    assert merged is not None and set(merged.signals) == {"gpu_util", "power_usage"}
    assert sources == {"gpu_util": "x", "power_usage": "x"}


def test_a_log_of_more_gpus_than_the_job_needs_the_jobs_gpu_ids() -> None:
    analysis = _smi([[1.0] * 3, [2.0] * 3, [3.0] * 3])
    assert pick_gpus(analysis, [], 2)[0] == []
    assert "nothing says which are the job's" in pick_gpus(analysis, [], 2)[1]
    assert pick_gpus(analysis, ["2", "0"], 2)[0] == ["0", "2"]
    assert pick_gpus(analysis, [], 3)[0] == ["0", "1", "2"]


def test_a_log_outside_the_job_or_without_time_is_not_used() -> None:
    ts = grid(START, START + 60, 30.0)
    later = _smi([[50.0] * 5], t0=START + 3600)
    got = log_signals(later, ts, 30.0, start=START, end=START + 60, gpu_count=1)
    assert not got.series and "outside the job's window" in got.note
    untimed = {"time_axis": "sample_index", "series": {"0": {"t_unix_s": [0, 1]}}, "gpu_assignment": {}}
    assert "no timestamps" in log_signals(untimed, ts, 30.0, start=START, end=START + 60).note


def test_an_analysis_from_the_older_parser_is_not_used_until_reparsed() -> None:
    ts = grid(START, START + 60, 30.0)
    old = dict(_smi([[50.0] * 7]))
    del old["gpu_assignment"]
    got = log_signals(old, ts, 30.0, start=START, end=START + 60, gpu_count=1)
    assert not got.series and "re-parse it" in got.note


def test_describe_names_the_log_and_the_assumed_zone() -> None:
    analysis = {"time_zone": {"zone": "UTC", "assumed": True, "local_timestamps": 10}}
    ts = grid(START, START + 60, 30.0)
    got = log_signals(_smi([[50.0] * 7]), ts, 30.0, start=START, end=START + 60, gpu_count=1)
    text = describe("gpu.csv", analysis, got)
    assert text.startswith(f"{LOG_SOURCE} 'gpu.csv' (1 GPU(s), 10 s samples")
    assert "read as UTC (assumed" in text
