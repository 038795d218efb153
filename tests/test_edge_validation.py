"""Validation at the edge (issue #13): a table of malformed requests, each answered with a 4xx and a message,
never a 500; plus the JSON 500 of the API and pages that render whatever a stored analysis holds."""

from __future__ import annotations

import json
import logging
import tempfile
from typing import Any

import pytest
from django.urls import reverse

from jobs.metrics.promql import Selector
from jobs.models import Artifact, Job, ProgressSample
from tests.conftest import job_body

BIG31 = 2**31
BIG63 = 2**63


@pytest.fixture
def api(make_team, make_user, api_client_for, catalog, media_root):
    team = make_team("llm")
    user = make_user("alice", teams=[team])
    client = api_client_for(user)
    assert client.post("/api/v1/jobs/", job_body(), format="json").status_code == 201
    return client


@pytest.fixture
def web(api, client, django_user_model):
    client.force_login(django_user_model.objects.get(username="alice"))
    return client


def _model(**overrides: Any) -> dict[str, Any]:
    return {**job_body()["model"], **overrides}


def _labels(n: int) -> dict[str, str]:
    return {f"label_{i}": "x" for i in range(n)}


# (case id, body overrides of a fresh registration, text the 400's message must contain)
SEL = {"gpus": None, "gpu_count": 8}
REGISTRATIONS: list[tuple[str, dict[str, Any], str]] = [
    ("micro_batch 2^31", {"micro_batch": BIG31}, "2147483647"),
    ("global_batch 2^31", {"global_batch": BIG31}, "2147483647"),
    ("gpu_count 2^31", {"gpus": None, "selector": {"hpc_job": "1"}, "gpu_count": BIG31}, "2147483647"),
    ("tokens_per_step 2^63", {"tokens_per_step": BIG63}, "9223372036854775807"),
    ("tp 2^31", {"parallelism": {"tp": BIG31}}, "2147483647"),
    ("n_params 1e308", {"model": _model(n_params=1e308)}, "1000000000000000"),
    ("n_params nan", {"model": _model(n_params="nan")}, "valid number"),
    ("n_params inf", {"model": _model(n_params="inf")}, "valid number"),
    ("active_params 1e20", {"model": _model(active_params=1e20)}, "1000000000000000"),
    ("n_layers 2^31", {"model": _model(n_layers=BIG31)}, "2147483647"),
    ("started_at year 1", {"started_at": "0001-01-01T00:00:00Z"}, "2000"),
    ("started_at a year back, running", {"started_at": "2025-11-01T00:00:00Z"}, "days"),
    ("started_at far future", {"started_at": "2100-01-01T00:00:00Z"}, "future"),
    ("window too long", {"started_at": "2026-01-01T00:00:00Z", "ended_at": "2026-11-01T00:00:00Z"}, "days"),
    ("ended_at far future", {"ended_at": "9999-12-31T00:00:00Z"}, "future"),
    ("30 labels", {"gpus": None, "selector": _labels(30), "gpu_count": 8}, "at most"),
    ("9 labels", {"gpus": None, "selector": _labels(9), "gpu_count": 8}, "at most"),
    ("7 labels: 128 alternatives", {"gpus": None, "selector": _labels(7), "gpu_count": 8}, "alternatives"),
    ("NUL in selector value", {"gpus": None, "selector": {"hpc_job": "a\x00b"}, "gpu_count": 8}, "control"),
    (
        "NUL in selector regex",
        {**SEL, "selector": {"pod": {"regex": "a\x00"}}},
        "control",
    ),
    (
        "control char in selector",
        {**SEL, "selector": {"hpc_job": "a\x1bb"}},
        "control",
    ),
    ("NUL in hostname", {"gpus": [{"hostname": "n\x00", "gpu": "0"}]}, "NUL"),
    ("NUL in external_id", {"external_id": "fresh\x00"}, "NUL"),
    ("NUL in name", {"name": "x\x00"}, "NUL"),
    ("control char in gpu", {"gpus": [{"hostname": "node", "gpu": "0\x07"}]}, "control"),
]


@pytest.mark.django_db
@pytest.mark.parametrize("case,overrides,message", REGISTRATIONS, ids=[c[0] for c in REGISTRATIONS])
def test_malformed_registrations_are_refused_with_the_bound(api, case, overrides, message):
    body = job_body(**{"external_id": "fresh", **overrides})
    body = {k: v for k, v in body.items() if v is not None}
    response = api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400, (case, response.status_code, response.content[:300])
    assert message in json.dumps(response.json()), response.json()
    assert not Job.objects.filter(external_id="fresh").exists()


# Raw bodies the JSON encoder of the test client would not produce (lone surrogates, deep nesting).
RAW_BODIES: list[tuple[str, str, str]] = [
    ("lone surrogate in selector", "/api/v1/jobs/",
     json.dumps(job_body("fresh", gpus=None, selector={"hpc_job": "PLACEHOLDER"}, gpu_count=8))
     .replace("PLACEHOLDER", "\\ud800")),
    ("lone surrogate in a label name", "/api/v1/jobs/",
     json.dumps(job_body("fresh", gpus=None, selector={"PLACEHOLDER": "1"}, gpu_count=8))
     .replace("PLACEHOLDER", "\\udfff")),
    ("lone surrogate in a name", "/api/v1/jobs/", json.dumps(job_body("fresh", name="PLACEHOLDER"))
     .replace("PLACEHOLDER", "\\ud83d")),
    ("nested 100000 deep", "/api/v1/jobs/", "[" * 100_000 + "]" * 100_000),
    ("nested selector", "/api/v1/jobs/",
     json.dumps(job_body("fresh", gpus=None, selector={"pod": "PLACEHOLDER"}, gpu_count=8))
     .replace('"PLACEHOLDER"', '{"regex": ' + "[" * 5000 + "]" * 5000 + "}")),
    ("progress nested", "/api/v1/jobs/48213/progress/", "[" * 50_000 + "]" * 50_000),
    ("not JSON", "/api/v1/jobs/", "{'a': 1"),
    ("NaN literal", "/api/v1/jobs/", json.dumps(job_body("fresh")).replace("6700000000.0", "NaN")),
    ("1e309 literal", "/api/v1/jobs/", json.dumps(job_body("fresh")).replace("6700000000.0", "1e309")),
]  # fmt: skip


@pytest.mark.django_db
@pytest.mark.parametrize("case,url,raw", RAW_BODIES, ids=[c[0] for c in RAW_BODIES])
def test_malformed_json_bodies_are_refused(api, case, url, raw):
    response = api.generic("POST", url, raw.encode("utf-8"), content_type="application/json")
    assert response.status_code == 400, (case, response.status_code, response.content[:300])
    assert response.json().get("detail") or response.json()
    assert not Job.objects.filter(external_id="fresh").exists()


# (case id, method, url, JSON body or None)
API_REQUESTS: list[tuple[str, str, str, Any]] = [
    ("limit -1", "get", "/api/v1/jobs/?limit=-1", None),
    ("limit 0", "get", "/api/v1/jobs/?limit=0", None),
    ("limit huge", "get", f"/api/v1/jobs/?limit={BIG63}", None),
    ("offset 2^63", "get", f"/api/v1/jobs/?offset={BIG63}", None),
    ("offset -1", "get", "/api/v1/jobs/?offset=-1", None),
    ("offset 1e3", "get", "/api/v1/jobs/?offset=1e3", None),
    ("artifacts limit -1", "get", "/api/v1/artifacts/?limit=-1", None),
    ("artifacts offset 2^63", "get", f"/api/v1/artifacts/?offset={BIG63}", None),
    ("baselines offset 2^63", "get", f"/api/v1/baselines/?offset={BIG63}", None),
    ("NUL in team filter", "get", "/api/v1/jobs/?team=%00", None),
    ("NUL in status filter", "get", "/api/v1/jobs/?status=a%00", None),
    ("NUL in fingerprint filter", "get", "/api/v1/baselines/?fingerprint=%00", None),
    ("NUL in path", "get", "/api/v1/jobs/a%00b/", None),
    ("control char in path", "get", "/api/v1/jobs/a%01b/", None),
    ("NUL in path of a write", "patch", "/api/v1/jobs/%00/", {"name": "x"}),
    ("leaderboard week 9999-W52", "get", "/api/v1/leaderboard/?week=9999-W52", None),
    ("leaderboard week 0001-W01", "get", "/api/v1/leaderboard/?week=0001-W01", None),
    ("leaderboard week 2026-W99", "get", "/api/v1/leaderboard/?week=2026-W99", None),
    ("leaderboard month 9999-12", "get", "/api/v1/leaderboard/?period=month&month=9999-12", None),
    ("leaderboard month 0001-01", "get", "/api/v1/leaderboard/?period=month&month=0001-01", None),
    ("leaderboard month 2026-13", "get", "/api/v1/leaderboard/?period=month&month=2026-13", None),
    ("progress tokens 2^63", "post", "/api/v1/jobs/48213/progress/",
     {"timestamp": "2026-11-23T09:00:00Z", "tokens": BIG63}),
    ("progress step 2^63", "post", "/api/v1/jobs/48213/progress/",
     {"timestamp": "2026-11-23T09:00:00Z", "step": BIG63, "tokens": 1}),
    ("progress timestamp year 1", "post", "/api/v1/jobs/48213/progress/",
     {"timestamp": "0001-01-01T00:00:00Z", "tokens": 1}),
    ("progress timestamp far future", "post", "/api/v1/jobs/48213/progress/",
     {"timestamp": "9999-12-31T00:00:00Z", "tokens": 1}),
    ("two points, one timestamp, different counts", "post", "/api/v1/jobs/48213/progress/",
     [{"timestamp": "2026-11-23T09:00:00Z", "step": 1, "tokens": 10},
      {"timestamp": "2026-11-23T09:00:00Z", "step": 2, "tokens": 20}]),
    ("patch ended_at far future", "patch", "/api/v1/jobs/48213/", {"ended_at": "9999-12-31T00:00:00Z"}),
    ("patch ended_at year 1", "patch", "/api/v1/jobs/48213/", {"ended_at": "0001-01-01T00:00:00Z"}),
    ("patch tokens_per_step 2^63", "patch", "/api/v1/jobs/48213/", {"tokens_per_step": BIG63}),
    ("patch name with NUL", "patch", "/api/v1/jobs/48213/", {"name": "a\x00"}),
    ("baseline job with NUL", "post", "/api/v1/baselines/", {"job": "\x00"}),
]  # fmt: skip


@pytest.mark.django_db
@pytest.mark.parametrize("case,method,url,body", API_REQUESTS, ids=[c[0] for c in API_REQUESTS])
def test_malformed_api_requests_answer_4xx_with_a_message(api, case, method, url, body):
    response = (
        getattr(api, method)(url, body, format="json") if body is not None else getattr(api, method)(url)
    )
    assert 400 <= response.status_code < 500, (case, response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json")
    assert response.json()


@pytest.mark.django_db
def test_re_registering_with_a_start_after_the_stored_end_is_a_conflict(api):
    assert (
        api.post("/api/v1/jobs/", job_body("e", ended_at="2026-11-24T00:00:00Z"), format="json").status_code
        == 201
    )
    response = api.post("/api/v1/jobs/", job_body("e", started_at="2026-11-25T00:00:00Z"), format="json")
    assert response.status_code == 409, response.content
    assert "ended_at" in json.dumps(response.json())
    assert Job.objects.get(external_id="e").started_at.day == 23


@pytest.mark.django_db
def test_the_same_progress_point_twice_in_one_request_is_stored_once(api):
    point = {"timestamp": "2026-11-23T09:00:00Z", "step": 1, "tokens": 10}
    response = api.post("/api/v1/jobs/48213/progress/", [point, dict(point)], format="json")
    assert response.status_code == 202, response.content
    assert list(ProgressSample.objects.values_list("step", "tokens")) == [(1, 10)]
    conflict = api.post("/api/v1/jobs/48213/progress/", [point, {**point, "tokens": 11}], format="json")
    assert conflict.status_code == 409 and "2026-11-23" in json.dumps(conflict.json())
    assert list(ProgressSample.objects.values_list("step", "tokens")) == [(1, 10)]


@pytest.mark.django_db
def test_upload_rank_past_the_column_range_is_refused(api):
    from django.core.files.uploadedfile import SimpleUploadedFile

    response = api.post(
        "/api/v1/jobs/48213/artifacts/",
        {"file": SimpleUploadedFile("p.txt", b"main (a.py:1) 5\n"), "rank": str(BIG31)},
        format="multipart",
    )
    assert response.status_code == 400 and "2147483647" in json.dumps(response.json())
    assert not Artifact.objects.exists()


@pytest.mark.django_db
def test_web_upload_rank_past_the_column_range_is_refused(web):
    from django.core.files.uploadedfile import SimpleUploadedFile

    response = web.post(
        reverse("job-artifact-upload", args=["48213"]),
        {"file": SimpleUploadedFile("p.txt", b"main (a.py:1) 5\n"), "rank": str(BIG31)},
        follow=True,
    )
    assert response.status_code < 500
    assert "Rank must be" in response.content.decode()
    assert not Artifact.objects.exists()


# (case id, URL name or path, query parameters)
PAGES: list[tuple[str, str, dict[str, str]]] = [
    ("since 2026-02-30", "/", {"since": "2026-02-30"}),
    ("until 9999-12-31", "/", {"until": "9999-12-31"}),
    ("since 0001-01-01", "/", {"since": "0001-01-01"}),
    ("team NUL", "/", {"team": "\x00"}),
    ("owner control char", "/", {"owner": "a\x1b"}),
    ("page NUL", "/", {"page": "\x00"}),
    ("leaderboard week 9999-W52", "/leaderboard/", {"week": "9999-W52"}),
    ("leaderboard week 0001-W01", "/leaderboard/", {"week": "0001-W01"}),
    ("leaderboard month 9999-12", "/leaderboard/", {"month": "9999-12"}),
    ("leaderboard month 0001-01", "/leaderboard/", {"month": "0001-01"}),
    ("report week 9999-W52", "/teams/llm/reports/9999-W52/", {}),
    ("report week 0001-W01", "/teams/llm/reports/0001-W01/", {}),
    ("figures end 1e20", "/jobs/48213/figures.json", {"start": "0", "end": "1e20"}),
    ("figures start -1e20", "/jobs/48213/figures.json", {"start": "-1e20", "end": "1"}),
    ("figures start year 1", "/jobs/48213/figures.json", {"start": "-62135596800", "end": "1700000000"}),
    ("figures end before start", "/jobs/48213/figures.json", {"start": "1764000000", "end": "1763000000"}),
    ("job page NUL", "/jobs/a%00b/", {}),
    ("baselines NUL", "/baselines/", {"retired": "\x00"}),
]


@pytest.mark.django_db
@pytest.mark.parametrize("case,url,params", PAGES, ids=[c[0] for c in PAGES])
def test_malformed_page_parameters_answer_4xx(web, case, url, params):
    response = web.get(url, params)
    assert 400 <= response.status_code < 500, (case, response.status_code)


@pytest.mark.django_db
def test_a_bad_date_filter_is_named_on_the_page(web):
    response = web.get("/", {"since": "2026-02-30"})
    assert response.status_code == 400 and "2026-02-30" in response.content.decode()
    response = web.get("/leaderboard/", {"week": "9999-W52"})
    assert response.status_code == 400 and "9999-W52" in response.content.decode()


@pytest.mark.django_db
def test_the_job_page_renders_any_stored_analysis(web):
    from jobs.intake.artifacts import analyze_file

    job = Job.objects.get(external_id="48213")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("main (train.py:10);step (train.py:20) 100\nmain (train.py:10);load (data.py:3) 50\n")
    analysis = analyze_file(f.name, "pyspy_raw", filename="profile.txt")
    analysis["samples"] = 10**23
    analysis["icicle"]["values"] = [10**23 for _ in analysis["icicle"]["values"]]
    Artifact.objects.create(
        job=job, kind="pyspy_raw", sha256="0" * 64, original_name="profile.txt", size_bytes=10,
        status="done", analysis=analysis,
    )  # fmt: skip
    response = web.get(reverse("job-detail", args=["48213"]))
    assert response.status_code == 200
    figures = web.get(reverse("job-figures", args=["48213"]))
    assert figures.status_code == 200


@pytest.mark.django_db
def test_an_unexpected_api_error_is_a_json_500_with_an_error_id_in_the_log(api, monkeypatch, caplog):
    from jobs.api import views

    def boom(job: Job) -> dict[str, Any]:
        raise RuntimeError("kaput")

    monkeypatch.setattr(views, "job_summary", boom)
    with caplog.at_level(logging.ERROR):
        response = api.get("/api/v1/jobs/48213/")
    assert response.status_code == 500
    body = response.json()
    assert set(body) == {"detail", "error_id"} and "kaput" not in body["detail"]
    assert body["error_id"] in caplog.text and "kaput" in caplog.text


def test_an_unexpected_error_outside_drf_under_api_is_a_json_500(rf, caplog):
    from efficiency.middleware import ApiErrorMiddleware

    middleware = ApiErrorMiddleware(lambda request: None)  # type: ignore[arg-type,return-value]
    request = rf.get("/api/v1/whatever")
    with caplog.at_level(logging.ERROR):
        response = middleware.process_exception(request, RuntimeError("kaput"))
    assert response is not None and response.status_code == 500
    body = json.loads(response.content)
    assert body["error_id"] in caplog.text
    assert middleware.process_exception(rf.get("/leaderboard/"), RuntimeError("x")) is None


def test_alternatives_are_counted_before_they_are_built():
    from jobs.metrics.promql import count_label_alternatives

    assert count_label_alternatives(_labels(3)) == 8
    assert count_label_alternatives({"Hostname": "a", "pod": "b"}) == 8
    assert count_label_alternatives(_labels(30)) == 2**30  # arithmetic only: nothing is built
    with pytest.raises(ValueError, match="alternatives"):
        Selector.from_labels(_labels(30))  # refused before itertools.product runs
    assert len(Selector.from_labels(_labels(6)).alternatives) == 64


ODD_VALUES = ["-1", "0", "9" * 30, "1e309", "-1e309", "nan", "inf", "9999-W52", "0001-W01", "9999-12",
              "0001-01", "2026-02-30", "9999-12-31", "'\"<>", "%", " ", "\ufffd", "a" * 3000]  # fmt: skip
PARAMS = ["week", "month", "by", "period", "since", "until", "page", "sort", "start", "end", "points", "only",
          "retired", "include_retired", "limit", "offset", "team", "status", "fingerprint", "owner", "model",
          "gpu"]  # fmt: skip
URLS = ["/", "/leaderboard/", "/teams/", "/teams/llm/", "/baselines/", "/catalog/", "/readiness/",
        "/jobs/48213/", "/jobs/48213/figures.json", "/api/v1/jobs/", "/api/v1/jobs/48213/",
        "/api/v1/artifacts/", "/api/v1/baselines/", "/api/v1/leaderboard/"]  # fmt: skip


@pytest.mark.django_db
@pytest.mark.parametrize("value", ODD_VALUES)
def test_no_odd_query_parameter_value_makes_a_page_or_the_api_fail(web, value):
    params = dict.fromkeys(PARAMS, value)
    failures = []
    for url in URLS:
        status = web.get(url, params).status_code
        if status >= 500:
            failures.append((url, status))
        if url == "/api/v1/leaderboard/":
            status = web.get(url, {**params, "period": "month"}).status_code
            if status >= 500:
                failures.append((url + "?period=month", status))
    assert not failures, failures
