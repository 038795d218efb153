"""The cross-GPU stats a finalize computes here (`fetch_job_signals(stats_here=True)`, jobs.metrics.cross_gpu)
are the ones Prometheus returns for `aggregate_query`, read from a real Prometheus: every registered field
of a simulated job (gauges, rates, levels, codes, the throttle bitmask) with missed scrapes, and hand-written
series holding NaN, +Inf and -Inf samples and a GPU that stops reporting.

Identical bit for bit where Prometheus itself is deterministic: a signal whose per-GPU expression is a
function of a selector (its input vector is then in label order). Where the expression is a binary one (a
unit scale such as GPU_UTIL's `* 0.01`, a throttle bit's `floor(x / b) % 2`), Prometheus 2.42 assembles
its input from a Go map, in no fixed order, and its own answers differ from run to run in the last bits:
there the two agree within 1e-12 relative.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from jobs.metrics.prometheus import PrometheusClient, RangeFetcher
from jobs.metrics.promql import Selector
from jobs.metrics.signal_queries import fetch_job_signals
from jobs.metrics.signals import SAMPLED, SIGNALS, JobSignals, Reading
from jobs.simulate import DEFAULT_START, SimResult, SimSpec, backfill, simulate, write_openmetrics
from tests.prom_server import PROMETHEUS_MODULE, PrometheusProcess

pytestmark = PROMETHEUS_MODULE
HOUR = 3600.0
T0 = DEFAULT_START
#: The hand-written host: 4 GPUs under DCGM 4.6 names (families of their own beside the simulated job's).
ODD_HOST = "node-z"


def _odd_series() -> str:
    """OpenMetrics for ODD_HOST, one sample per 30 s for an hour: SM activity with a NaN sample on GPU 0,
    +Inf and -Inf on GPU 1, GPU 2 silent for 20 minutes, GPU 3 at 0; XID codes with a NaN and a 79; clock
    event reasons with several bits set and a NaN."""
    n = 120
    ts = T0 + 30.0 * np.arange(1, n + 1)
    sm: dict[str, list[float | None]] = {
        "0": [float("nan") if i == 10 else 0.5 for i in range(n)],
        "1": [float("inf") if i == 20 else float("-inf") if i == 50 else 0.25 + 0.001 * i for i in range(n)],
        "2": [None if 30 <= i < 70 else 0.75 - 0.002 * i for i in range(n)],
        "3": [0.0] * n,
    }
    xid: dict[str, list[float | None]] = {
        "0": [0.0] * n,
        "1": [79.0 if 40 <= i < 44 else 0.0 for i in range(n)],
        "2": [float("nan") if i == 5 else 0.0 for i in range(n)],
        "3": [None if i > 60 else 0.0 for i in range(n)],
    }
    reasons: dict[str, list[float | None]] = {
        "0": [float(0x4 | 0x1) if i % 3 else 0.0 for i in range(n)],
        "1": [float(0x40 | 0x20 | 0x4) if i > 80 else float(0x1) for i in range(n)],
        "2": [float("nan") if i == 7 else float(0x8) for i in range(n)],
        "3": [float(0x80) for _ in range(n)],
    }
    lines = []
    for name, kind, rows in (
        ("DCGM_FI_PROF_SM_UTIL_RATIO", "gauge", sm),
        ("DCGM_FI_DEV_XID_ERROR", "gauge", xid),
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", reasons),
    ):
        lines.append(f"# TYPE {name} {kind}")
        for gpu, values in rows.items():
            for t, v in zip(ts, values, strict=True):
                if v is None:
                    continue
                text = (
                    "NaN" if np.isnan(v) else "+Inf" if v == np.inf else "-Inf" if v == -np.inf else repr(v)
                )
                lines.append(f'{name}{{Hostname="{ODD_HOST}",gpu="{gpu}"}} {text} {t:.3f}')
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def sim() -> SimResult:
    """8 GPUs on 2 hosts, every registered field, 5 % of the scrapes missed, 2 hours."""
    return simulate(
        SimSpec(
            scenario="false_saturation", gpus=8, gpus_per_host=4, job_id="7001", duration_s=2 * HOUR,
            seed=11, missing_fraction=0.05, params={"health_fields": "all"},
        )
    )  # fmt: skip


@pytest.fixture(scope="module")
def prom(sim: SimResult, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusProcess]:
    work: Path = tmp_path_factory.mktemp("cross-gpu")
    write_openmetrics([sim], work / "sim.om")
    backfill(work / "sim.om", work / "tsdb")
    (work / "odd.om").write_text(_odd_series())
    backfill(work / "odd.om", work / "tsdb")
    with PrometheusProcess(work / "tsdb") as server:
        yield server


def _read(prom: PrometheusProcess, selector: Selector, end: float, step: float, *, here: bool) -> JobSignals:
    """The aggregates as a finalize reads them (4 range queries in flight, the window cut in small parts)."""
    client = PrometheusClient(prom.url, timeout_s=30, retries=0)
    with RangeFetcher(client, 4, name="test-cross-gpu") as fetcher:
        return fetch_job_signals(
            client, selector, T0, end, step, scrape_interval_s=30.0, max_samples=600, gpus_hint=4,
            fetcher=fetcher, stats_here=here,
        )  # fmt: skip


def _deterministic(key: str, names: list[str]) -> bool:
    """Whether Prometheus 2.42 aggregates `key`'s per-GPU expression in label order (no binary operator)."""
    sig = SIGNALS[key]
    return sig.reading is not Reading.BITMASK and all(sig.scale_of(n) == 1.0 for n in names)


def _compare(server: JobSignals, here: JobSignals, present: set[str]) -> dict[str, int]:
    """Assert the same signals, missing reasons and stats; returns {signal: cross-GPU stats compared bit
    for bit}."""
    assert here.signals.keys() == server.signals.keys()
    assert here.missing == server.missing
    exact: dict[str, int] = {}
    for key, theirs in server.signals.items():
        ours = here.signals[key]
        assert ours.stats.keys() == theirs.stats.keys(), key
        names = [n for n in SIGNALS[key].names if n in present]
        for stat, expected in theirs.stats.items():
            got = ours.stats[stat]
            if stat == SAMPLED:  # Prometheus' own `sum(count_over_time)` either way
                assert got.tobytes() == expected.tobytes(), (key, stat)
            elif _deterministic(key, names):
                assert got.tobytes() == expected.tobytes(), (key, stat, got, expected)
                exact[key] = exact.get(key, 0) + 1
            else:
                np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0, equal_nan=True, err_msg=key)
    return exact


@pytest.mark.parametrize("step", [30.0, 120.0])
def test_stats_computed_here_are_prometheus_own_for_every_field(prom: PrometheusProcess, sim: SimResult,
                                                                step: float) -> None:  # fmt: skip
    selector = Selector.from_gpus([{"hostname": g.hostname, "gpu": g.index} for g in sim.gpus]).restricted(
        ["Hostname", "gpu"]
    )
    assert selector is not None
    end = T0 + 2 * HOUR
    server = _read(prom, selector, end, step, here=False)
    here = _read(prom, selector, end, step, here=True)
    client = PrometheusClient(prom.url, timeout_s=30, retries=0)
    present = set(client.label_values("__name__", selector.series_selectors(".+"), T0, end))
    exact = _compare(server, here, present)
    readings = {SIGNALS[k].reading for k in here.signals}
    assert {Reading.GAUGE, Reading.RATE, Reading.LEVEL, Reading.CODE, Reading.BITMASK} <= readings
    assert len(here.signals) >= 30 and len(exact) >= 20  # most fields compared bit for bit
    # Missed scrapes show: fewer samples than GPUs x step / scrape somewhere.
    util = here.signals["gpu_util"]
    assert np.nanmin(util.stats[SAMPLED]) < 8.0 <= np.nanmax(util.stats[SAMPLED]) + 1e-9


def test_nan_infinities_and_a_silent_gpu_give_prometheus_own_stats(prom: PrometheusProcess) -> None:
    selector = Selector.from_gpus([{"hostname": ODD_HOST, "gpu": g} for g in range(4)]).restricted(
        ["Hostname", "gpu"]
    )
    assert selector is not None
    end = T0 + HOUR
    server = _read(prom, selector, end, 120.0, here=False)
    here = _read(prom, selector, end, 120.0, here=True)
    assert set(here.signals) == {"sm_active", "xid_errors", "clock_throttle_reasons"}
    exact = _compare(server, here, {"DCGM_FI_PROF_SM_UTIL_RATIO", "DCGM_FI_DEV_XID_ERROR",
                                    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"})  # fmt: skip
    assert set(exact) == {"sm_active", "xid_errors"}
    sm = here.signals["sm_active"].stats
    # The odd samples reach the stats: the windows with NaN (T0 + 6 min: sample 10 of GPU 0) and +Inf
    # (T0 + 12 min) have no mean, as Prometheus' NaN and Inf are stored (no value), their min still has
    # one; 3 GPUs while GPU 2 is silent.
    ts = here.timestamps
    for at in (T0 + 360, T0 + 720):
        k = int(np.flatnonzero(ts == at)[0])
        assert np.isnan(sm["mean"][k]) and sm["min"][k] == 0.0
    assert set(np.unique(sm["count"][1:])) == {3.0, 4.0}
    assert np.nanmax(here.signals["xid_errors"].stats["max"]) == 79.0
