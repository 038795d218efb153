"""One job-list FilterSet (jobs.views.filters, issue #27 item 4): the page, its CSV export and the API read
the same query string the same way, so for any query string the three list the same jobs in the same order,
and refuse the same unreadable values."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from html import unescape

import pytest
from django.urls import reverse

from jobs.models import Job


@pytest.fixture
def alice(make_user, make_team):
    return make_user("alice", teams=[make_team("llm"), make_team("vision")])


@pytest.fixture
def jobs(make_team):
    llm, vision = make_team("llm"), make_team("vision")

    def make(external_id, team, name, owner, day, **kw):
        return Job.objects.create(
            external_id=external_id, team=team, name=name, owner=owner, gpu_count=8,
            started_at=datetime(2026, 11, day, 9, tzinfo=UTC), **kw,
        )  # fmt: skip

    make("a1", llm, "pretrain-llama", "Alice", 2, model_name="llama-7b", mfu=0.41, waste_per_day_usd=90.0)
    make("a2", llm, "finetune-llama-lora", "bob", 5, model_name="llama-7b", mfu=0.22, waste_per_day_usd=300.0)
    make("a3", llm, "eval", "alice", 9, model_name="llama-70b", mfu=None, waste_per_day_usd=None)
    make("b1", vision, "vit-LoRA", "carol", 12, model_name="vit-h", mfu=0.35, waste_per_day_usd=120.0,
         status=Job.Status.FINALIZED, ended_at=datetime(2026, 11, 13, tzinfo=UTC))  # fmt: skip
    make("b2", vision, "vit-pretrain", "Bob", 20, model_name="vit-h", mfu=0.18, waste_per_day_usd=500.0)


def _page(client, query: str) -> tuple[int, list[str]]:
    response = client.get(f"{reverse('job-list')}?{query}")
    return response.status_code, [job.external_id for job in response.context["page"].object_list]


def _csv(client, query: str) -> tuple[int, list[str]]:
    response = client.get(f"{reverse('job-list-csv')}?{query}")
    if response.status_code != 200:
        return response.status_code, []
    text = b"".join(response.streaming_content).decode()
    return 200, [row["job id"] for row in csv.DictReader(io.StringIO(text))]


def _api(api, query: str) -> tuple[int, list[str]]:
    response = api.get(f"/api/v1/jobs/?{query}")
    if response.status_code != 200:
        return response.status_code, []
    return 200, [job["external_id"] for job in response.json()["results"]]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", ["b2", "b1", "a3", "a2", "a1"]),  # newest first
        ("q=LLAMA", ["a2", "a1"]),  # substring of the name, any case
        ("q=b", ["b2", "b1"]),  # ... or of the external id
        ("mine=1", ["a3", "a1"]),  # owner = the logged-in user, any case
        ("mine=yes", ["b2", "b1", "a3", "a2", "a1"]),  # not a ticked box: no filter
        ("owner=BOB", ["b2", "a2"]),
        ("team=vision", ["b2", "b1"]),
        ("status=finalized", ["b1"]),
        ("model=llama-7b", ["a2", "a1"]),
        ("since=2026-11-05&until=2026-11-12", ["b1", "a3", "a2"]),  # until includes its day
        ("sort=-mfu", ["a1", "b1", "a2", "b2", "a3"]),  # unknown MFU last either way
        ("sort=mfu", ["b2", "a2", "b1", "a1", "a3"]),
        ("sort=-waste&team=llm", ["a2", "a1", "a3"]),
        ("q=lora&sort=started", ["a2", "b1"]),
        ("sort=bogus", ["b2", "b1", "a3", "a2", "a1"]),  # an unknown sort falls back to newest first
        ("q=+lora+&owner=+bob+", ["a2"]),  # values are stripped
    ],
)
def test_page_csv_and_api_list_the_same_jobs_for_the_same_query_string(
    client, alice, jobs, api_client_for, query, expected
):
    client.force_login(alice)
    api = api_client_for(alice)
    assert _page(client, query) == (200, expected)
    assert _csv(client, query) == (200, expected)
    assert _api(api, query) == (200, expected)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("since=yesterday", "'yesterday' is not a date"),
        ("until=2026-02-30", "'2026-02-30' is not a date"),
        ("status=bogus", "'bogus' is not a job status"),
    ],
)
def test_page_csv_and_api_refuse_the_same_unreadable_filter_naming_it(
    client, alice, jobs, api_client_for, query, message
):
    client.force_login(alice)
    page = client.get(f"{reverse('job-list')}?team=vision&{query}")
    # The page still lists what the other filters select, and says which one it ignored.
    assert page.status_code == 400 and message in unescape(page.content.decode())
    assert [job.external_id for job in page.context["page"].object_list] == ["b2", "b1"]
    exported = client.get(f"{reverse('job-list-csv')}?team=vision&{query}")
    assert exported.status_code == 400 and message in exported.content.decode()
    answered = api_client_for(alice).get(f"/api/v1/jobs/?team=vision&{query}")
    assert answered.status_code == 400 and message in answered.content.decode()


@pytest.fixture
def baselines(make_team):
    from jobs.models import Baseline

    llm = make_team("llm")
    made = {}
    for key, fingerprint, retired in (
        ("active-a", "fp-a", False),
        ("old-a", "fp-a", True),
        ("b", "fp-b", False),
    ):
        made[key] = Baseline.objects.create(
            fingerprint=fingerprint, model_name=key, team=llm, stats={},
            retired_at=datetime(2026, 11, 1, tzinfo=UTC) if retired else None,
        )  # fmt: skip
    return {b.pk: key for key, b in made.items()}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", {"active-a", "b"}),  # retired ones left out by default
        ("include_retired=1", {"active-a", "old-a", "b"}),
        ("fingerprint=fp-a", {"active-a"}),
        ("fingerprint=fp-a&include_retired=1", {"active-a", "old-a"}),
        ("include_retired=yes", {"active-a", "b"}),
    ],
)
def test_baselines_page_and_api_list_the_same_baselines_for_the_same_query_string(
    client, alice, baselines, api_client_for, query, expected
):
    client.force_login(alice)
    rows = client.get(f"{reverse('baseline-list')}?{query}").context["rows"]
    assert {baselines[row["baseline"].pk] for row in rows} == expected
    listed = api_client_for(alice).get(f"/api/v1/baselines/?{query}").json()["results"]
    assert {baselines[b["id"]] for b in listed} == expected


def test_every_job_filter_is_documented_in_the_api_schema_and_the_page_form_keys():
    """The API schema's parameters and the page's form keys come from the FilterSet's own filters."""
    from jobs.views.filters import FILTER_KEYS, JOB_FILTER_HELP, JobFilterSet

    assert set(JobFilterSet.base_filters) == set(JOB_FILTER_HELP) == {*FILTER_KEYS, "sort"}
