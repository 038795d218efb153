"""nvidia-smi logs longer than MAX_POINTS samples per GPU (stored as bucket means) are judged on their full
samples (issue #24 item 2 follow-up): no database.
"""

from __future__ import annotations

import numpy as np
import pytest

from jobs.evaluation.kpis import idle_share_per_gpu
from jobs.evaluation.monitoring_signals import log_signals
from jobs.metrics.signals import MEAN, grid
from jobs.profiling.monitoring_common import MAX_POINTS, downsample
from jobs.profiling.nvidia_smi import analyze_nvidia_smi

START = 1_700_000_000.0


def _cycled_log(samples: int, busy: int, idle: int, interval_s: float = 1.0) -> bytes:
    """One GPU at 1 s: `busy` samples at 95 % then `idle` at 0 %, repeated (a loop's short stalls)."""
    lines = ["timestamp, index, utilization.gpu [%], power.draw [W]"]
    period = busy + idle
    for k in range(samples):
        util = 95 if k % period < busy else 0
        lines.append(f"{START + interval_s * k:.3f}, 0, {util} %, {100 + util:.1f} W")
    return ("\n".join(lines) + "\n").encode()


# By construction: 6,000 one-second samples, 8 busy (95 %) then 2 idle (0 %) every 10 s: 1,200 idle samples =
# 20 % idle, mean 0.8 x 95 = 76 %. Stored as 2,000 bucket means of 3 samples, the idle pairs never fill a
# bucket (samples 8, 9 fall in buckets [6, 8] and [9, 11], each with a 95 % sample): every bucket mean is at
# least 31.7 %, so judged on bucket means the log shows no idle time at all.


def test_bucket_means_alone_lose_short_idle_gaps() -> None:
    analysis = analyze_nvidia_smi(_cycled_log(6000, busy=8, idle=2))
    assert analysis["idle_share_pct"] == 20.0  # the parser's own statistic reads every sample
    (series,) = analysis["series"].values()
    means = np.array(series["utilization_gpu_pct"])
    assert means.size == MAX_POINTS and float(means.min()) == pytest.approx(95 / 3, abs=1e-3)
    assert int((means <= 5.0).sum()) == 0  # the loss the counts below repair
    assert sum(series["bucket_samples"]) == 6000
    assert sum(series["utilization_gpu_pct_idle_samples"]) == 1200


def test_the_evaluation_counts_idle_samples_of_a_bucketed_log_exactly() -> None:
    analysis = analyze_nvidia_smi(_cycled_log(6000, busy=8, idle=2))
    ts = grid(START, START + 6000, 60.0)
    got = log_signals(analysis, ts, 60.0, start=START, end=START + 6000, gpu_count=1)
    util = got.series["gpu_util"]
    assert got.interval_s == pytest.approx(1.0)  # the log's own 1 s, not the 3 s bucket spacing
    assert util.per_gpu is not None and util.per_gpu.shape == (1, 6000)
    assert idle_share_per_gpu(util.per_gpu) == pytest.approx(0.2)
    assert float(np.nanmean(util.per_gpu)) == pytest.approx(0.76, abs=1e-6)
    # A full 60 s window holds 6 of the 10 s cycles: mean 0.76 there too.
    assert util.stats[MEAN][5] == pytest.approx(0.76, abs=1e-6)
    assert got.series["power_usage"].per_gpu is not None


def test_a_log_within_max_points_is_stored_whole_and_read_as_before() -> None:
    analysis = analyze_nvidia_smi(_cycled_log(1000, busy=8, idle=2))
    (series,) = analysis["series"].values()
    assert "bucket_samples" not in series and len(series["utilization_gpu_pct"]) == 1000
    got = log_signals(analysis, grid(START, START + 1000, 60.0), 60.0, start=START, end=START + 1000)
    assert got.series["gpu_util"].per_gpu is not None
    assert idle_share_per_gpu(got.series["gpu_util"].per_gpu) == pytest.approx(0.2)


def test_downsample_counts_idle_and_missing_samples_per_bucket() -> None:
    t = np.arange(6, dtype=np.float64)
    util = np.array([0.0, 50.0, np.nan, 3.0, 4.0, 90.0])
    out = downsample(t, {"u": util}, 2, idle_key="u", idle_max=5.0)
    assert out["bucket_samples"] == [3, 3]
    assert out["u"] == [25.0, pytest.approx(97 / 3, abs=1e-4)]  # the missing reading is not a zero
    assert out["u_valid_samples"] == [2, 3]
    assert out["u_idle_samples"] == [1, 2]
    assert out["u_idle_mean"] == [0.0, 3.5]
