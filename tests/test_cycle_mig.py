"""MIG instances read once per poll cycle (`mig.mig_instances_of`, issue #14): per job the same answer
as its own `mig_instances` query, with a number of queries that does not grow with the number of jobs,
against a real Prometheus holding simulated MIG instances (GPU_I_ID / GPU_I_PROFILE, no GPU_UTIL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs.evaluation import mig, sharing
from jobs.metrics.prometheus import PrometheusClient
from jobs.models import Job
from jobs.simulate import DEFAULT_START, SimSpec, backfill, simulate, write_openmetrics
from tests.prom_server import PROMETHEUS_MODULE, PrometheusProcess

pytestmark = PROMETHEUS_MODULE

HOUR = 3600.0
START = datetime.fromtimestamp(DEFAULT_START, tz=UTC)
NOW = START + timedelta(hours=1.5)


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    sims = [
        # Two MIG instances of one GPU on node-m, matched by hpc_job label.
        simulate(SimSpec(gpus=1, job_id="6001", duration_s=2 * HOUR, seed=11, hosts=("node-m",),
                         mig=(("1", "3g.40gb"),))),
        simulate(SimSpec(gpus=1, job_id="6002", duration_s=2 * HOUR, seed=12, hosts=("node-m",),
                         mig=(("2", "4g.40gb"),))),
        # A MIG instance on node-x without a job label (explicit GPU lists), and whole GPUs on node-t.
        simulate(SimSpec(gpus=1, job_id=None, job_labels="none", duration_s=2 * HOUR, seed=13,
                         hosts=("node-x",), mig=(("5", "1g.10gb"),))),
        simulate(SimSpec(gpus=2, job_id="6003", duration_s=2 * HOUR, seed=14, hosts=("node-t",))),
    ]  # fmt: skip
    work = tmp_path_factory.mktemp("cycle-mig")
    write_openmetrics(sims, work / "data.om")
    backfill(work / "data.om", work / "tsdb")
    with PrometheusProcess(work / "tsdb") as server:
        yield server


class Counting(PrometheusClient):
    """A real client that counts its instant queries."""

    instants = 0

    def instant(self, query, at=None):  # type: ignore[no-untyped-def]
        self.instants += 1
        return super().instant(query, at)


def _job(pk: int, *, selector=None, gpus=None, started=START) -> Job:
    # Unsaved: the look-up reads only the job's selection and window.
    return Job(pk=pk, external_id=str(pk), started_at=started, selector=selector or {}, gpus=gpus or [])


def _jobs(extra_label_jobs: int) -> list[Job]:
    jobs = [
        _job(1, selector={"hpc_job": "6001"}),
        _job(2, selector={"hpc_job": "6002"}),
        _job(3, selector={"hpc_job": "6003"}),
        _job(4, selector={"hpc_job": "600."}),  # unescaped, "600." would match 6001-6003
        _job(5, gpus=[{"hostname": "node-x", "gpu": 0}]),
        _job(6, gpus=[{"hostname": "node-t", "gpu": 0}, {"hostname": "node-t", "gpu": 1}]),
        _job(7, gpus=[{"hostname": "node-x", "gpu": 0}], started=START + timedelta(hours=1)),  # younger
        _job(8, selector={"hpc_job": {"regex": "600[12]"}}),  # a regex: not batched
    ]
    jobs += [_job(100 + i, selector={"hpc_job": f"9{i:03d}"}) for i in range(extra_label_jobs)]
    return jobs


def test_the_batched_look_up_answers_what_each_jobs_own_query_answers(prom):
    client = Counting(prom.url, timeout_s=20, retries=0)
    jobs = _jobs(0)
    got = mig.mig_instances_of(client, jobs, NOW)
    batched = client.instants
    own = {job.pk: mig.mig_instances(client, job, NOW) for job in jobs}
    assert got == {pk: own[pk] for pk in own if pk != 8}  # the regex job is left to its own query
    assert 8 not in got
    # Not vacuous: the MIG instances are found, by label and by explicit GPU, and 600. finds none.
    assert got[1] == {"node-m/0": ("1", "3g.40gb")} and got[2] == {"node-m/0": ("2", "4g.40gb")}
    assert got[5] == got[7] == {"node-x/0": ("5", "1g.10gb")}
    assert got[3] == got[4] == got[6] == {}
    # Jobs 1-6 started 1.5 h before NOW: one lookback (MIG_LOOKBACK_S, 1 h); job 7 started 0.5 h before,
    # so its own window (1800 s) is its own query: hpc_job jobs 1 query, explicit GPUs 2 (two windows).
    assert batched == 3


def test_the_number_of_mig_queries_does_not_grow_with_the_number_of_jobs(prom):
    few, many = Counting(prom.url, timeout_s=20, retries=0), Counting(prom.url, timeout_s=20, retries=0)
    mig.mig_instances_of(few, _jobs(0), NOW)
    found = mig.mig_instances_of(many, _jobs(200), NOW)
    assert few.instants == many.instants == 3
    assert all(found[100 + i] == {} for i in range(200))


@pytest.mark.django_db
def test_the_sharing_look_up_uses_the_cycles_instances_instead_of_asking(prom, make_team):
    team = make_team("llm")
    job = Job.objects.create(external_id="6001", team=team, gpu_count=1, started_at=START,
                             selector={"hpc_job": "6001"})  # fmt: skip
    client = Counting(prom.url, timeout_s=20, retries=0)
    asked = sharing.attribute_shares(job, sharing.look_up(job, client, NOW), NOW)
    assert client.instants == 1
    given = sharing.attribute_shares(
        job, sharing.look_up(job, client, NOW, mig={job.pk: {"node-m/0": ("1", "3g.40gb")}}), NOW
    )
    assert client.instants == 1  # no query: the cycle's map answered
    assert given.mig == asked.mig == {"node-m/0": ("1", "3g.40gb")}
    assert given.share == asked.share
