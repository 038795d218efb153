"""Shared GPUs (jobs.alerts.sharing): time-sliced and MIG GPUs detected on simulated exporter data through
a real Prometheus, and each GPU's cost attributed per share (the shares sum to the GPU's cost)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs.alerts import sharing
from jobs.alerts.sharing import Usage, attribute, mig_fraction
from jobs.metrics import ingest
from jobs.metrics.prometheus import PrometheusClient
from jobs.registry import register_job
from jobs.simulate import DEFAULT_START, SimSpec, backfill, registration_body, simulate, write_openmetrics
from tests.prom_server import PrometheusProcess, prometheus_binary

HOUR = 3600.0
START = datetime.fromtimestamp(DEFAULT_START, tz=UTC)


def test_mig_profiles_hold_their_compute_slices():
    assert mig_fraction("3g.40gb") == pytest.approx(3 / 7)
    assert mig_fraction("1c.3g.40gb") == pytest.approx(3 / 7)
    assert mig_fraction("7g.80gb") == 1.0
    assert mig_fraction("") is None and mig_fraction("full") is None


def test_time_slicing_splits_the_overlap_evenly_and_the_cost_sums_to_the_gpus():
    # A holds the GPU 0-2 h, B 1-3 h: A alone 1 h, both 1 h (half each), B alone 1 h.
    a = Usage("n/0", "A", 0, 2 * HOUR)
    b = Usage("n/0", "B", HOUR, 3 * HOUR)
    att = attribute([a, b])
    assert att.shares[("A", "n/0")] == pytest.approx(1.5 * HOUR)
    assert att.shares[("B", "n/0")] == pytest.approx(1.5 * HOUR)
    assert att.job_share("A") == pytest.approx(0.75)
    cost = att.cost_usd(4.0)
    assert sum(cost.values()) == pytest.approx(3 * 4.0)  # the GPU was held 3 h: $12, split, not $16


def test_mig_slices_get_their_fraction_and_free_slices_stay_unallocated():
    a = Usage("n/0", "A", 0, HOUR, instance="1", profile="3g.40gb")
    b = Usage("n/0", "B", 0, HOUR, instance="2", profile="2g.20gb")
    att = attribute([a, b])
    assert att.shares[("A", "n/0")] == pytest.approx(HOUR * 3 / 7)
    assert att.shares[("B", "n/0")] == pytest.approx(HOUR * 2 / 7)
    assert att.unallocated["n/0"] == pytest.approx(HOUR * 2 / 7)
    assert sum(att.shares.values()) + att.unallocated["n/0"] == pytest.approx(HOUR)


@pytest.fixture(scope="module")
def sims():
    mig_a = simulate(SimSpec(gpus=1, job_id="6001", duration_s=2 * HOUR, seed=11, hosts=("node-m",)))
    mig_b = simulate(SimSpec(gpus=1, job_id="6002", duration_s=2 * HOUR, seed=12, hosts=("node-m",)))
    for sim, (instance, profile) in ((mig_a, ("1", "3g.40gb")), (mig_b, ("2", "4g.40gb"))):
        sim.gpus[0].labels.update({"GPU_I_ID": instance, "GPU_I_PROFILE": profile})
    sliced_a = simulate(SimSpec(gpus=2, job_id="6003", duration_s=2 * HOUR, seed=13, hosts=("node-t",)))
    sliced_b = simulate(SimSpec(gpus=1, job_id="6004", duration_s=HOUR, seed=14, hosts=("node-t",),
                                start=DEFAULT_START + HOUR))  # fmt: skip
    alone = simulate(SimSpec(gpus=1, job_id="6005", duration_s=2 * HOUR, seed=15, hosts=("node-z",)))
    return {s.spec.job_id: s for s in (mig_a, mig_b, sliced_a, sliced_b, alone)}


@pytest.fixture(scope="module")
def prom(sims, tmp_path_factory):
    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (Debian package 'prometheus')")
    work = tmp_path_factory.mktemp("sharing-prom")
    write_openmetrics(list(sims.values()), work / "data.om")
    backfill(work / "data.om", work / "tsdb")
    with PrometheusProcess(work / "tsdb") as server:
        yield server


@pytest.mark.prometheus
@pytest.mark.django_db
def test_mig_and_time_sliced_gpus_on_simulated_exporter_data(prom, sims, make_team, catalog):
    team = make_team("llm")
    client = PrometheusClient(prom.url, timeout_s=10, retries=0)
    jobs = {}
    for job_id, sim in sims.items():
        body = registration_body(sim, team=team, ended=True)
        if job_id in ("6001", "6002"):  # MIG jobs are matched by label, as a device plugin would
            body.pop("gpus")
            body["selector"] = {"hpc_job": job_id}
        jobs[job_id] = register_job(body).job
        ingest.finalize_job(jobs[job_id], client, now=START + timedelta(hours=3))
    now = START + timedelta(hours=3)

    mig = sharing.shared_gpus(jobs["6001"], client, now)
    assert [(s.gpu, s.other_job, s.mig) for s in mig.shared] == [("node-m/0", "6002", True)]
    assert mig.share == pytest.approx(3 / 7)
    price = 6.88  # H100 on demand, USD per GPU-hour (the seeded price book)
    cost = mig.attribution.cost_usd(price)
    assert cost["6001"] == pytest.approx(2 * price * 3 / 7) and cost["6002"] == pytest.approx(
        2 * price * 4 / 7
    )
    assert sum(cost.values()) == pytest.approx(2 * price)  # the GPU's cost for its 2 hours, once
    payload = sharing.finding_payload(mig)
    assert payload is not None and payload["code"] == "shared_gpu" and "MIG" in payload["title"]

    sliced = sharing.shared_gpus(jobs["6003"], client, now)
    assert {(s.gpu, s.other_job) for s in sliced.shared} == {("node-t/0", "6004")}
    # 6003 holds node-t/0 and node-t/1 for 2 h; 6004 shares node-t/0 in the second hour: 6003's share is
    # (1 h + 0.5 h + 2 h) / 4 GPU-hours.
    assert sliced.share == pytest.approx(3.5 / 4)
    total = sum(sliced.attribution.cost_usd(price).values())
    assert total == pytest.approx(4 * price)  # 4 GPU-hours on node-t, once
    assert sharing.finding_payload(sharing.shared_gpus(jobs["6005"], client, now)) is None
