"""Two range queries in flight in a poll cycle (`cluster.read_cycle(workers=2)`, issue #14): the same
per-job signals and the same request count as one at a time, against the real Prometheus of
tests/test_cluster_poll.py."""

from __future__ import annotations

import numpy as np

from jobs.metrics import cluster
from tests.test_cluster_poll import GPU_STEP, MIN, STEP, T0, _client, _targets, prom, pytestmark, sims

__all__ = ["prom", "pytestmark", "sims"]  # the module's fixtures and marks, shared


def test_two_queries_in_flight_read_what_one_at_a_time_reads(prom, sims):
    end = T0 + 70 * MIN
    targets = _targets(sims, end)
    with _client(prom) as serial, _client(prom) as pooled:
        one = cluster.read_cycle(serial, targets, step=STEP, per_gpu_step=GPU_STEP, scrape_interval_s=30.0)
        two = cluster.read_cycle(pooled, targets, step=STEP, per_gpu_step=GPU_STEP, scrape_interval_s=30.0,
                                 workers=2)  # fmt: skip
        assert pooled.requests == serial.requests == one.queries == two.queries
    assert one.errors == two.errors == {} and one.fallback == two.fallback == []
    assert set(one.signals) == set(two.signals) == {t.key for t in targets}
    for key, mine in two.signals.items():
        theirs = one.signals[key]
        assert mine.missing == theirs.missing and set(mine.signals) == set(theirs.signals)
        for sig, series in mine.signals.items():
            other = theirs.signals[sig]
            for stat, values in other.stats.items():
                # Prometheus sums in no fixed order, so two runs of one query differ in the last bits.
                np.testing.assert_allclose(series.stats[stat], values, rtol=1e-9, atol=1e-12, equal_nan=True,
                                           err_msg=f"{key} {sig} {stat}")  # fmt: skip
            assert series.gpus == other.gpus
            np.testing.assert_allclose(series.per_gpu, other.per_gpu, rtol=1e-9, equal_nan=True)
