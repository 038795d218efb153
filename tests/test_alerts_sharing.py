"""Shared GPUs (jobs.evaluation.sharing): time-sliced and MIG GPUs detected on simulated exporter data (MIG
instances labelled GPU_I_ID / GPU_I_PROFILE, without GPU_UTIL, as dcgm-exporter emits them) through a real
Prometheus; each GPU's cost attributed per share through the one evaluation (the jobs' stored costs of a
GPU sum to the GPU's cost); the shared_gpu finding on the job page, the job list and the API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from html import unescape

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from jobs.evaluation import sharing
from jobs.evaluation.gpu_attribution import Attribution, Usage, attribute, mig_fraction
from jobs.intake.registry import register_job
from jobs.metrics.prometheus import PrometheusClient
from jobs.models import Finding, Job
from jobs.pipeline import poll as pipeline
from jobs.pipeline.refresh import reevaluate
from jobs.simulate import DEFAULT_START, SimSpec, backfill, registration_body, simulate, write_openmetrics
from tests.prom_server import PrometheusProcess, prometheus_binary

HOUR = 3600.0
START = datetime.fromtimestamp(DEFAULT_START, tz=UTC)


def _gpu_hours_by_job(att: Attribution) -> dict[str, float]:
    hours: dict[str, float] = {}
    for (job, _), seconds in att.shares.items():
        hours[job] = hours.get(job, 0.0) + seconds / HOUR
    return hours


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
    # The GPU was held 3 h: 3 GPU-hours charged once, split (at $4/GPU-h $12, not $16). Cost is charged on
    # these GPU-equivalents by the evaluation (kpis._cost), not by the attribution.
    assert sum(att.shares.values()) == pytest.approx(3 * HOUR)


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
    # 6001 / 6002: two MIG instances (3g.40gb, 4g.40gb) of one H100 on node-m, 2 h each.
    mig_a = simulate(
        SimSpec(
            gpus=1, job_id="6001", duration_s=2 * HOUR, seed=11, hosts=("node-m",), mig=(("1", "3g.40gb"),)
        )
    )
    mig_b = simulate(
        SimSpec(
            gpus=1, job_id="6002", duration_s=2 * HOUR, seed=12, hosts=("node-m",), mig=(("2", "4g.40gb"),)
        )
    )
    # 6003 holds node-t/0 and node-t/1 for 2 h; 6004 time-slices node-t/0 in the second hour.
    sliced_a = simulate(SimSpec(gpus=2, job_id="6003", duration_s=2 * HOUR, seed=13, hosts=("node-t",)))
    sliced_b = simulate(
        SimSpec(
            gpus=1, job_id="6004", duration_s=HOUR, seed=14, hosts=("node-t",), start=DEFAULT_START + HOUR
        )
    )
    alone = simulate(SimSpec(gpus=1, job_id="6005", duration_s=2 * HOUR, seed=15, hosts=("node-z",)))
    return {s.spec.job_id: s for s in (mig_a, mig_b, sliced_a, sliced_b, alone)}  # fmt: skip


@pytest.fixture(scope="module")
def prom(sims, tmp_path_factory):
    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (Debian package 'prometheus')")
    work = tmp_path_factory.mktemp("sharing-prom")
    write_openmetrics(list(sims.values()), work / "data.om")
    backfill(work / "data.om", work / "tsdb")
    with PrometheusProcess(work / "tsdb") as server:
        yield server


NOW = START + timedelta(hours=3)
PRICE = 6.88  # H100 on demand, USD per GPU-hour (the seeded price book)


@pytest.fixture
def jobs(prom, sims, make_team, catalog, settings):
    # node-t is declared time-sliced by the platform: only then is an overlap a share (jobs.access.ownership).
    settings.TIME_SLICED_GPUS = ["node-t/*"]
    team = make_team("llm")
    client = PrometheusClient(prom.url, timeout_s=10, retries=0)
    out = {}
    for job_id, sim in sims.items():
        body = registration_body(sim, team=team, ended=True)
        if job_id in ("6001", "6002"):  # MIG jobs are matched by label, as a device plugin would
            body.pop("gpus")
            body["selector"] = {"hpc_job": job_id}
        out[job_id] = register_job(body).job
        pipeline.finalize_job(out[job_id], client, now=NOW)
    return out, client


@pytest.mark.prometheus
@pytest.mark.django_db
def test_mig_and_time_sliced_gpus_on_simulated_exporter_data(jobs):
    jobs, client = jobs
    mig = sharing.attribute_shares(jobs["6001"], sharing.look_up(jobs["6001"], client, NOW), NOW)
    assert [(s.gpu, s.other_job, s.mig) for s in mig.shared] == [("node-m/0", "6002", True)]
    assert mig.mig == {"node-m/0": ("1", "3g.40gb")}  # from GR_ENGINE_ACTIVE: MIG series have no GPU_UTIL
    assert mig.share == pytest.approx(3 / 7)
    hours = _gpu_hours_by_job(mig.attribution)
    assert hours["6001"] == pytest.approx(2 * 3 / 7)
    assert hours["6002"] == pytest.approx(2 * 4 / 7)
    assert sum(hours.values()) == pytest.approx(2)  # the GPU's 2 hours, charged once

    sliced = sharing.attribute_shares(jobs["6003"], sharing.look_up(jobs["6003"], client, NOW), NOW)
    assert {(s.gpu, s.other_job) for s in sliced.shared} == {("node-t/0", "6004")}
    # 6003 holds node-t/0 and node-t/1 for 2 h; 6004 shares node-t/0 in the second hour: 6003's share is
    # (1 h + 0.5 h + 2 h) / 4 GPU-hours.
    assert sliced.share == pytest.approx(3.5 / 4)
    assert sum(_gpu_hours_by_job(sliced.attribution).values()) == pytest.approx(4)
    assert (
        sharing.summarise(
            sharing.attribute_shares(jobs["6005"], sharing.look_up(jobs["6005"], client, NOW), NOW), 1, None
        )
        is None
    )


@pytest.mark.prometheus
@pytest.mark.django_db
def test_the_overlapping_jobs_other_keys_are_read_in_one_query(jobs):
    jobs, _ = jobs
    with CaptureQueriesContext(connection) as queries:
        report = sharing.attribute_shares(jobs["6003"], sharing.look_up(jobs["6003"], None, NOW), NOW)
    # The overlapping jobs, then the archived GPU keys of all of them (6001/6002 are matched by label).
    assert len(queries) == 2, [q["sql"][:120] for q in queries]
    assert report.share == pytest.approx(3.5 / 4)


@pytest.mark.prometheus
@pytest.mark.django_db
def test_stored_costs_are_the_jobs_shares_and_sum_to_each_gpus_cost(jobs):
    jobs, _ = jobs
    # 6003 was finalized before 6004 was registered: its next evaluation (from the archive) sees 6004.
    for job_id in ("6003", "6004"):
        reevaluate(jobs[job_id].pk)
    stored = {j.external_id: j for j in Job.objects.filter(external_id__in=list(jobs))}
    # MIG node-m/0, 2 h: 6001 holds 3/7, 6002 4/7 of $13.76.
    assert stored["6001"].cost_usd == pytest.approx(2 * PRICE * 3 / 7, rel=1e-6)
    assert stored["6002"].cost_usd == pytest.approx(2 * PRICE * 4 / 7, rel=1e-6)
    assert stored["6001"].cost_usd + stored["6002"].cost_usd == pytest.approx(2 * PRICE, rel=1e-6)
    # node-t: 6003 3.5 GPU-h, 6004 0.5 GPU-h (half of node-t/0 for 1 h): 4 GPU-h in all, $27.52.
    assert stored["6003"].cost_usd == pytest.approx(3.5 * PRICE, rel=1e-6)
    assert stored["6004"].cost_usd == pytest.approx(0.5 * PRICE, rel=1e-6)
    assert stored["6003"].cost_usd + stored["6004"].cost_usd == pytest.approx(4 * PRICE, rel=1e-6)
    assert stored["6005"].cost_usd == pytest.approx(2 * PRICE, rel=1e-6)  # alone: the whole GPU
    ev = stored["6001"].evaluated
    assert ev is not None and ev.sharing is not None
    assert ev.sharing.label == "0.43 of 1 GPU, MIG 3g.40gb"
    assert ev.gpu_hours == pytest.approx(2 * 3 / 7)
    # MFU against the slice: 48 of 132 SMs. The same tokens/s against the whole GPU would read lower.
    assert ev.sharing.peak_equivalents == pytest.approx(48 / 132)
    assert stored["6003"].evaluated.sharing.gpu_equivalents == pytest.approx(2 * 3.5 / 4)
    assert stored["6005"].evaluated.sharing is None


@pytest.mark.prometheus
@pytest.mark.django_db
def test_the_shared_gpu_finding_is_stored_and_shown_on_the_page_list_and_api(
    jobs, make_user, client, api_client_for
):
    jobs, _ = jobs
    for job_id in ("6003", "6004"):
        reevaluate(jobs[job_id].pk)
    found = Finding.objects.get(job=jobs["6003"], code="shared_gpu")
    assert found.severity == "warning" and "thinned out" in found.title
    labels = {e["label"]: e["value"] for e in found.evidence}
    assert labels["time-sliced GPUs"] == "node-t/0" and labels["other jobs on them"] == "6004"
    mig = Finding.objects.get(job=jobs["6001"], code="shared_gpu")
    assert mig.severity == "info" and "3g.40gb" in mig.title
    assert not Finding.objects.filter(job=jobs["6005"], code="shared_gpu").exists()

    user = make_user("alice", teams=[jobs["6003"].team])
    client.force_login(user)
    page = client.get(reverse("job-detail", args=["6003"]))
    assert page.status_code == 200
    html = page.content.decode()
    assert "thinned out" in html and "time-sliced" in html
    # The MIG job's page says what it was charged for (the evaluation's note, the cost definition).
    mig_page = unescape(client.get(reverse("job-detail", args=["6001"])).content.decode())
    assert "0.43 of 1 GPU, MIG 3g.40gb" in mig_page and "GPU equivalents" in mig_page
    assert client.get(reverse("job-list")).status_code == 200
    api = api_client_for(user).get("/api/v1/jobs/6003/")
    assert api.status_code == 200
    assert "shared_gpu" in [f["code"] for f in api.json()["findings"]]


# 6N + 12·L·H·Q·T of job_body's model (N = 6.7e9, L = 32, H = 32, Q = 128, T = 4096).
FLOPS_PER_TOKEN = 6 * 6.7e9 + 12 * 32 * 32 * 128 * 4096


@pytest.mark.django_db
def test_a_job_registered_on_a_mig_device_name_is_charged_and_measured_as_its_slice(make_team, catalog):
    from django.utils import timezone

    from jobs.api.serializers import JobRegisterSerializer
    from jobs.models import ProgressSample
    from tests.conftest import job_body

    make_team("llm")
    start = timezone.now() - timedelta(hours=3)
    end = start + timedelta(hours=2)
    body = JobRegisterSerializer(
        data=job_body(
            "6101", gpu_model="NVIDIA-H100-80GB-HBM3-MIG-3g.40gb", gpus=[{"hostname": "node-q", "gpu": "0"}],
            started_at=start.isoformat(), ended_at=end.isoformat(),
        )
    )  # fmt: skip
    body.is_valid(raise_exception=True)
    job = register_job(body.validated_data).job
    assert job.gpu_model is not None and job.gpu_model.name == "H100 SXM"  # the parent GPU's row
    # Tokens for an MFU of 0.30 of the slice's peak (48 of 132 SMs of 989.5 TFLOP/s) over the 2 h.
    tps = 0.30 * (48 / 132) * 989.5e12 / FLOPS_PER_TOKEN
    ProgressSample.objects.create(job=job, timestamp=start, tokens=0)
    ProgressSample.objects.create(job=job, timestamp=end, tokens=round(tps * 7200))
    job = reevaluate(job.pk)
    assert job.mfu == pytest.approx(0.30, rel=1e-4)
    # Billed 3/7 of the H100: 2 h × $6.88 × 3/7 = $5.90; $/day 6.88 × 24 × 3/7 = $70.77.
    assert job.cost_usd == pytest.approx(2 * PRICE * 3 / 7, rel=1e-6)
    assert job.cost_per_day_usd == pytest.approx(PRICE * 24 * 3 / 7, rel=1e-6)
    # Waste of the slice's cost against the slice's MFU: 70.77 × (1 − 0.30 / 0.45) = $23.59/day.
    assert job.waste_per_day_usd == pytest.approx(PRICE * 24 * 3 / 7 * (1 - 0.30 / 0.45), rel=1e-3)
    assert job.evaluated.sharing.label == "0.43 of 1 GPU, MIG 3g.40gb"
    assert Finding.objects.get(job=job, code="shared_gpu").severity == "info"


@pytest.mark.prometheus
@pytest.mark.django_db
def test_a_job_joining_a_gpu_re_evaluates_the_job_already_on_it(
    prom, sims, make_team, catalog, celery_eager, django_capture_on_commit_callbacks, settings
):
    settings.TIME_SLICED_GPUS = ["node-t/*"]
    team = make_team("llm")
    client = PrometheusClient(prom.url, timeout_s=10, retries=0)
    with django_capture_on_commit_callbacks(execute=True):
        first = register_job(registration_body(sims["6003"], team=team, ended=True)).job
        pipeline.finalize_job(first, client, now=NOW)
    first.refresh_from_db()
    assert first.cost_usd == pytest.approx(4 * PRICE, rel=1e-6)  # alone so far: 2 GPUs x 2 h
    with django_capture_on_commit_callbacks(execute=True):
        second = register_job(registration_body(sims["6004"], team=team, ended=True)).job
        pipeline.finalize_job(second, client, now=NOW)
    first.refresh_from_db()
    second.refresh_from_db()
    # 6004's evaluation named 6003, whose stored one did not name 6004: 6003 was queued and re-evaluated.
    assert first.cost_usd == pytest.approx(3.5 * PRICE, rel=1e-6)
    assert first.cost_usd + second.cost_usd == pytest.approx(4 * PRICE, rel=1e-6)
