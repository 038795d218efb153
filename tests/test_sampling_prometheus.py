"""Sampling against a real Prometheus (hand-written scrapes backfilled with promtool): a step averages
every sample inside it, a missing scrape is a gap rather than the lookback's last value, and coverage
says how much of the window the samples cover. Expected values are derived by hand in the comments."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from jobs.metrics.prometheus import PrometheusClient, Selector
from jobs.metrics.sampling import GAP_FACTOR, coverage_note, time_weighted_mean
from jobs.metrics.signal_queries import fetch_job_signals
from jobs.metrics.signals import COUNT, MAX, MEAN, SAMPLED, SIGNALS, grid
from jobs.simulate import DEFAULT_START, backfill
from tests.prom_server import PROMETHEUS_MODULE, PrometheusProcess

pytestmark = PROMETHEUS_MODULE

T0 = DEFAULT_START  # 2026-01-01T00:00:00Z, a multiple of 60 and 300 s
SCRAPE = 15.0
GAPPY = Selector.from_labels({"hpc_job": "gappy"})
DENSE = Selector.from_labels({"hpc_job": "dense"})


def _openmetrics() -> str:
    """Two pods, one GPU each, scraped every 15 s.

    gappy: GPU_UTIL at T0 + 15k, k = 1..20, slots 6-14 failed (9 of 20 = 45 %); 10 % for k <= 5, 40 % after.
    dense: POWER_USAGE 10k W at T0 + 15k, k = 1..8 (10, 20, ..., 80 W).
    """
    util = [
        f'DCGM_FI_DEV_GPU_UTIL{{Hostname="n1",gpu="0",hpc_job="gappy"}} {10 if k <= 5 else 40} '
        f"{T0 + 15 * k:.0f}"
        for k in range(1, 21)
        if k <= 5 or k >= 15
    ]
    power = [
        f'DCGM_FI_DEV_POWER_USAGE{{Hostname="n2",gpu="0",hpc_job="dense"}} {10 * k} {T0 + 15 * k:.0f}'
        for k in range(1, 9)
    ]
    return "\n".join(
        [
            "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
            *util,
            "# TYPE DCGM_FI_DEV_POWER_USAGE gauge",
            *power,
            "# EOF",
            "",
        ]
    )


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusClient]:
    work: Path = tmp_path_factory.mktemp("sampling-prom")
    (work / "data.om").write_text(_openmetrics())
    backfill(work / "data.om", work / "tsdb")
    with PrometheusProcess(work / "tsdb") as prom, PrometheusClient(prom.url, timeout_s=10, retries=0) as c:
        yield c


def test_missing_scrapes_are_gaps_and_the_mean_is_over_the_samples_that_exist(
    client: PrometheusClient,
) -> None:
    sig = SIGNALS["gpu_util"]
    start, end = T0 + 15, T0 + 300
    # Before: an instant selector at each 15 s point reads the latest sample within the 5 min lookback,
    # so the 135 s hole (slots 6-14) repeats slot 5's 10 %: (14 x 10 + 6 x 40) / 20 = 19.0 %.
    old = client.range(f"avg({GAPPY.select(sig.metrics)}) * 0.01", start, end, SCRAPE)
    assert float(np.mean(old[0].values)) == pytest.approx(0.19)

    js = fetch_job_signals(client, GAPPY, start, end, SCRAPE, keys=["gpu_util"], scrape_interval_s=SCRAPE)
    s = js.signals["gpu_util"]
    assert s.mean is not None
    # After: each point averages (t - 15, t]; the 9 empty windows are NaN, not 10 %.
    assert int(np.isnan(s.mean).sum()) == 9
    # Samples that exist: (5 x 10 + 6 x 40) / 11 = 290 / 11 = 26.36 %.
    assert float(np.nanmean(s.mean)) == pytest.approx(2.9 / 11)
    m = time_weighted_mean(s.mean, js.timestamps, GAP_FACTOR * SCRAPE)
    assert m.mean == pytest.approx(2.9 / 11)
    # Coverage: 11 windows of 20 hold their one expected sample -> 11 / 20 = 55 %, noted (< 90 %).
    assert m.coverage == pytest.approx(0.55)
    assert s.coverage == pytest.approx(0.55)
    assert coverage_note(js.coverage("gpu_util")) == "coverage 55 %"


def test_a_60_s_step_over_15_s_scrapes_averages_four_samples(client: PrometheusClient) -> None:
    start, end = T0 + 60, T0 + 120
    js = fetch_job_signals(client, DENSE, start, end, 60.0, keys=["power_usage"], scrape_interval_s=SCRAPE)
    s = js.signals["power_usage"]
    np.testing.assert_array_equal(js.timestamps, grid(start, end, 60.0))
    # (T0, T0+60] holds 10, 20, 30, 40 W -> 25 W; (T0+60, T0+120] holds 50, 60, 70, 80 -> 65 W. The sample
    # at T0+60 sits on the boundary: Prometheus 2's closed window would count it twice without the 1 ms.
    # An instant query would keep every 4th sample instead: 40 and 80 W.
    np.testing.assert_allclose(s.stats[MEAN], [25.0, 65.0])
    np.testing.assert_allclose(s.stats[MAX], [25.0, 65.0])  # one GPU: its window mean
    np.testing.assert_array_equal(s.stats[COUNT], [1.0, 1.0])
    # 4 samples x 15 s / 60 s = 1 GPU fully covered per window -> coverage 100 %, no note.
    np.testing.assert_allclose(s.stats[SAMPLED], [1.0, 1.0])
    assert s.coverage == 1.0 and coverage_note(s.coverage) is None


def test_per_gpu_rows_average_their_own_step(client: PrometheusClient) -> None:
    # Per-GPU grid at 60 s from T0+60 (already a multiple of 60): the GPU's row is 25 W, 65 W as above.
    js = fetch_job_signals(
        client,
        DENSE,
        T0 + 60,
        T0 + 120,
        60.0,
        keys=["power_usage"],
        per_gpu_step=60.0,
        scrape_interval_s=SCRAPE,
    )
    s = js.signals["power_usage"]
    assert s.per_gpu is not None and s.gpu_timestamps is not None
    np.testing.assert_array_equal(s.gpu_timestamps, [T0 + 60, T0 + 120])
    np.testing.assert_allclose(s.per_gpu, [[25.0, 65.0]])
