"""Registrations cannot read other jobs' data: a non-staff selector must match the job's own job label
exactly (or list GPUs), and throughput_query is a template that reads only the job's own series (free-form
PromQL is for staff); stored legacy queries are not run, with the reason."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from django.utils import timezone

from jobs.evaluation.load import throughput_of
from jobs.metrics.signals import JobSignals
from jobs.metrics.throughput import FREE_FORM_MARK
from jobs.models import Job
from jobs.pipeline.reads import read_inputs
from tests.conftest import job_body

pytestmark = pytest.mark.django_db


@pytest.fixture
def member(make_team, make_user, api_client_for):
    return api_client_for(make_user("alice", teams=[make_team("llm")]))


@pytest.fixture
def staff(make_team, make_user, api_client_for):
    make_team("llm")
    return api_client_for(make_user("root", staff=True))


def _selector_body(selector, external_id="48213"):
    body = job_body(external_id, selector=selector, gpu_count=8)
    body.pop("gpus")
    return body


def test_a_member_cannot_select_every_gpu_with_a_regex_and_is_told_the_rule(member):
    response = member.post("/api/v1/jobs/", _selector_body({"Hostname": {"regex": ".+"}}), format="json")
    assert response.status_code == 400
    message = response.json()["selector"][0]
    assert "job's own job label as an exact match" in message and "gpus" in message
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "selector",
    [
        {"hpc_job": {"regex": "48213"}},
        {"hpc_job": {"regex": ".*"}},
        {"hpc_job": "99999"},
        {"namespace": "llm"},
    ],
)
def test_a_regex_or_another_jobs_value_on_the_job_label_is_refused(member, selector):
    assert member.post("/api/v1/jobs/", _selector_body(selector), format="json").status_code == 400


def test_the_jobs_own_label_exactly_or_explicit_gpus_are_accepted(member):
    own = _selector_body({"hpc_job": "48213", "Hostname": {"regex": "node-.*"}})
    assert member.post("/api/v1/jobs/", own, format="json").status_code == 201
    assert member.post("/api/v1/jobs/", job_body("777"), format="json").status_code == 201


def test_staff_may_register_any_selector(staff):
    assert (
        staff.post("/api/v1/jobs/", _selector_body({"Hostname": {"regex": ".+"}}), format="json").status_code
        == 201
    )


def test_a_stored_violating_selector_keeps_working_but_re_registering_it_is_refused(member, make_team):
    Job.objects.create(external_id="48213", team=make_team("llm"), gpu_count=8, selector={"namespace": "llm"},
                       started_at=timezone.now() - timedelta(hours=1))  # fmt: skip
    assert member.get("/api/v1/jobs/48213/").status_code == 200
    response = member.post("/api/v1/jobs/", _selector_body({"namespace": "llm"}), format="json")
    assert response.status_code == 400


def test_a_throughput_query_reading_another_jobs_series_is_refused(member):
    body = job_body(throughput_query='sum(rate(train_tokens_total{job_id="their-job"}[5m]))')
    response = member.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400
    assert "label matchers other than $job" in response.json()["throughput_query"][0]


def test_a_throughput_query_with_a_regex_on_the_job_label_is_refused(member):
    body = job_body(throughput_query='sum(rate(train_tokens_total{$job, job_id=~".+"}[5m]))')
    assert member.post("/api/v1/jobs/", body, format="json").status_code == 400
    patched = job_body(throughput_query="sum(rate(train_tokens_total{$job}[5m]))")
    assert member.post("/api/v1/jobs/", patched, format="json").status_code == 201
    bad = member.patch(
        "/api/v1/jobs/48213/", {"throughput_query": 'sum(rate(t{job_id=~".+"}[5m]))'}, format="json"
    )
    assert bad.status_code == 400


def test_free_form_promql_is_for_staff_only(member, staff):
    body = job_body(throughput_query="sum(rate(train_tokens_total[5m]))", throughput_query_free_form=True)
    assert member.post("/api/v1/jobs/", body, format="json").status_code == 403
    assert staff.post("/api/v1/jobs/", body, format="json").status_code == 201
    assert Job.objects.get().throughput_query == FREE_FORM_MARK + "sum(rate(train_tokens_total[5m]))"


def throughput_series(job: Job, ts: np.ndarray, client: object) -> tuple[np.ndarray | None, str]:
    """The job's throughput on the grid `ts` as an evaluation gets it: read by the driver, then chosen."""
    sigs = JobSignals(float(ts[0]), float(ts[-1]), float(ts[1] - ts[0]), ts)
    readings = read_inputs(job, sigs, client, timezone.now())  # type: ignore[arg-type]
    return throughput_of(job, ts, readings.throughput)


class RecordingClient:
    """Stands in for PrometheusClient: records the queries and their timeout, answers nothing."""

    def __init__(self) -> None:
        self.timeout_s = 10.0
        self.queries: list[tuple[str, float]] = []

    def range(self, query, start, end, step):
        self.queries.append((query, self.timeout_s))
        return []

    def instant(self, query, at):  # the read step's MIG look-up (jobs.evaluation.sharing.look_up)
        return []


def test_a_good_template_runs_expanded_with_the_jobs_own_id_and_the_query_timeout(member, settings):
    settings.THROUGHPUT_QUERY_TIMEOUT_S = 2.5
    body = job_body(throughput_query="sum(rate(train_tokens_total{$job}[5m]))")
    assert member.post("/api/v1/jobs/", body, format="json").status_code == 201
    client = RecordingClient()
    ts = np.arange(0.0, 300.0, 30.0)
    throughput_series(Job.objects.get(), ts, client)
    # job_body lists GPUs explicitly, so $job is job_id="<external id>"; only that job's series are read.
    assert client.queries == [('sum(rate(train_tokens_total{job_id="48213"}[5m]))', 2.5)]
    assert client.timeout_s == 10.0  # restored for the poll's other queries


def test_a_stored_free_form_query_not_set_by_staff_is_not_run_and_says_why(make_team):
    job = Job.objects.create(external_id="legacy", team=make_team("llm"), gpu_count=8,
                             throughput_query='sum(rate(train_tokens_total{job_id="x"}[5m]))',
                             started_at=timezone.now() - timedelta(hours=1))  # fmt: skip
    client = RecordingClient()
    tps, reason = throughput_series(job, np.arange(0.0, 300.0, 30.0), client)
    assert tps is None and client.queries == []
    assert "free-form PromQL not set by staff" in reason and "$job" in reason
