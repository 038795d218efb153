"""One promote rule (issue 23, item 3): team-scoped baselines, the health guard on every path, and what a
job is compared with. The attacks: a member of team A promoting a run with team B's model and config
through the API (before: 201 and B's baseline grew), and promoting a run with a critical gpu_errors finding
through the API with no override (before: 201 and nothing recorded)."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.apps import apps as live_apps
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from jobs.evaluation import baselines
from jobs.evaluation.load import reference_for
from jobs.intake.registry import fingerprint_for
from jobs.models import Baseline, Finding, GpuModel, Job, PromotionOverride

ENDED = timezone.now() - timedelta(days=1)


def _run(team: Any, external_id: str, mfu: float, *, finished: bool = True, **fields: Any) -> Job:
    """A 8-GPU llama-7b run of `team` (the same model and config for every team: one fingerprint)."""
    job = Job(
        external_id=external_id,
        name=f"pretrain {external_id}",
        team=team,
        model_name="llama-7b",
        model_config={"n_params": 6.7e9, "seq_len": 4096},
        dtype="bf16",
        parallelism={"tp": 1, "pp": 1, "dp": 8, "ep": 1},
        micro_batch=4,
        global_batch=256,
        gpu_model=GpuModel.objects.get(name="H100 SXM"),
        gpu_count=8,
        started_at=ENDED - timedelta(hours=3),
        ended_at=ENDED if finished else None,
        status=Job.Status.FINALIZED if finished else Job.Status.RUNNING,
        mfu=mfu,
        tokens_per_second=mfu * 1e6,
        sm_active_mean=0.8,
        **fields,
    )
    job.config_fingerprint = fingerprint_for(job)
    job.save()
    return job


def _finding(job: Job, code: str, severity: str) -> Finding:
    return Finding.objects.create(
        job=job, code=code, severity=severity, confidence=0.9, title=f"{code} title", recommendation="check"
    )


@pytest.fixture
def two_teams(catalog, make_team, make_user, api_client_for, settings):
    """Team A (llm, alice) and team B (vision, bob) run the same model and config; B has a baseline."""
    settings.READ_SCOPE = "team"
    a, b = make_team("llm"), make_team("vision")
    alice, bob = make_user("alice", teams=[a]), make_user("bob", teams=[b])
    b_runs = [_run(b, "b1", 0.50), _run(b, "b2", 0.52)]
    for run in b_runs:
        baselines.promote(run, bob)
    return SimpleNamespace(
        a=a,
        b=b,
        alice=alice,
        bob=bob,
        as_alice=api_client_for(alice),
        as_bob=api_client_for(bob),
        b_baseline=Baseline.objects.get(team=b),
    )


@pytest.mark.django_db
def test_promoting_a_run_with_another_teams_config_creates_the_own_teams_baseline_and_leaves_the_other(
    two_teams,
):
    t = two_teams
    a1 = _run(t.a, "a1", 0.20)
    assert a1.config_fingerprint == t.b_baseline.fingerprint  # the attack's premise: the same config
    b_stats_before = t.b_baseline.stats

    response = t.as_alice.post("/api/v1/baselines/", {"job": "a1"}, format="json")

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["team"] == "llm" and body["runs"] == ["a1"] and body["id"] != t.b_baseline.pk
    t.b_baseline.refresh_from_db()
    assert sorted(t.b_baseline.runs.values_list("external_id", flat=True)) == ["b1", "b2"]
    assert t.b_baseline.stats == b_stats_before
    assert t.b_baseline.stats["mfu"]["median"] == pytest.approx(0.51)
    # Two active baselines of one fingerprint, one per team.
    assert Baseline.objects.filter(fingerprint=a1.config_fingerprint, retired_at__isnull=True).count() == 2


@pytest.mark.django_db
def test_another_teams_baseline_is_neither_readable_nor_writable_under_team_scope(two_teams):
    t = two_teams
    _run(t.a, "a1", 0.20)
    t.as_alice.post("/api/v1/baselines/", {"job": "a1"}, format="json")
    b_id = t.b_baseline.pk

    listed = t.as_alice.get("/api/v1/baselines/").json()
    assert [row["team"] for row in listed["results"]] == ["llm"]
    by_fingerprint = t.as_alice.get(f"/api/v1/baselines/?fingerprint={t.b_baseline.fingerprint}").json()
    assert [row["team"] for row in by_fingerprint["results"]] == ["llm"]
    assert t.as_alice.get(f"/api/v1/baselines/{b_id}/").status_code == 404
    assert t.as_alice.post(f"/api/v1/baselines/{b_id}/retire/").status_code == 404
    # B's run cannot be pushed into anything by A (404: not even its existence is confirmed).
    assert t.as_alice.post("/api/v1/baselines/", {"job": "b1"}, format="json").status_code == 404
    t.b_baseline.refresh_from_db()
    assert t.b_baseline.retired_at is None and t.b_baseline.runs.count() == 2

    # The pages: the baselines list names only A's; retiring B's is a 404.
    client = Client()
    client.force_login(t.alice)
    page = client.get(reverse("baseline-list")).content.decode()
    assert f'id="baseline-{b_id}"' not in page and "b1" not in page
    assert client.post(reverse("baseline-retire", args=[b_id]), {"confirm": "yes"}).status_code == 404


@pytest.mark.django_db
def test_a_job_is_compared_with_its_own_teams_baseline_only(two_teams):
    t = two_teams
    a_slow = _run(t.a, "a-slow", 0.20)
    # A has no baseline of this config: the job page and the API compare with nothing, and the reference
    # MFU its waste is measured against is the organisation's target, not B's median (0.51).
    assert baselines.compare(a_slow) is None
    assert t.as_alice.get("/api/v1/jobs/a-slow/").json()["baseline"] is None
    reference, source = reference_for(a_slow)
    assert "baseline" not in source and reference != pytest.approx(0.51)
    client = Client()
    client.force_login(t.alice)
    page = client.get(reverse("job-detail", args=["a-slow"])).content.decode()
    assert "LLM has no baseline for this model and config yet" in page

    baselines.promote(_run(t.a, "a-good", 0.30), t.alice)
    comparison = baselines.compare(a_slow)
    assert comparison is not None and comparison.baseline.team == t.a
    assert {run.external_id for run in comparison.baseline.runs.all()} == {"a-good"}
    assert reference_for(a_slow)[0] == pytest.approx(0.30)
    summary = t.as_alice.get("/api/v1/jobs/a-slow/").json()["baseline"]
    assert summary["runs"] == ["a-good"]
    page = client.get(reverse("job-detail", args=["a-slow"])).content.decode()
    assert "LLM's baseline for llama-7b" in page and "over 1 healthy run" in page
    assert "pretrain b1" not in page and "/jobs/b1/" not in page and "/jobs/b2/" not in page
    # B's jobs still read B's baseline.
    assert reference_for(_run(t.b, "b-new", 0.4))[0] == pytest.approx(0.51)
    # Promoting into A's baseline re-evaluates A's jobs of the config, never B's.
    assert set(baselines.jobs_of_baseline(comparison.baseline)) == set(
        Job.objects.filter(team=t.a).values_list("pk", flat=True)
    )


@pytest.mark.django_db
def test_api_promote_of_a_run_with_a_critical_gpu_errors_finding_is_refused_without_an_override(two_teams):
    t = two_teams
    run = _run(t.a, "a-xid", 0.31)
    _finding(run, "gpu_errors", "critical")

    refused = t.as_alice.post("/api/v1/baselines/", {"job": "a-xid"}, format="json")

    assert refused.status_code == 409
    assert refused.json()["findings"] == ["gpu_errors"]
    assert "gpu_errors (critical)" in refused.json()["job"][0]
    assert "override reason" in refused.json()["job"][0]
    assert not Baseline.objects.filter(team=t.a).exists()
    # A blank reason is no reason.
    blank = t.as_alice.post("/api/v1/baselines/", {"job": "a-xid", "override_reason": "   "}, format="json")
    assert blank.status_code == 409 and not PromotionOverride.objects.exists()


@pytest.mark.django_db
def test_api_promote_with_an_override_reason_is_accepted_and_the_override_recorded(two_teams):
    t = two_teams
    run = _run(t.a, "a-xid", 0.31)
    _finding(run, "gpu_errors", "critical")
    _finding(run, "throttling", "warning")
    _finding(run, "straggler", "info")  # info does not block and is not recorded

    body = {"job": "a-xid", "override_reason": "XID 79 on one node after the last step; numbers fine"}
    accepted = t.as_alice.post("/api/v1/baselines/", body, format="json")

    assert accepted.status_code == 201, accepted.json()
    baseline = Baseline.objects.get(pk=accepted.json()["id"])
    assert baseline.team == t.a and list(baseline.runs.all()) == [run]
    override = PromotionOverride.objects.get()
    assert (override.baseline, override.job, override.user) == (baseline, run, t.alice)
    assert override.finding_codes == ["gpu_errors", "throttling"]
    assert override.reason == "XID 79 on one node after the last step; numbers fine"
    # Promoting again changes nothing: the first override stays the record.
    again = t.as_alice.post("/api/v1/baselines/", {**body, "override_reason": "other"}, format="json")
    assert again.status_code == 201 and again.json()["runs"] == ["a-xid"]
    assert list(PromotionOverride.objects.values_list("reason", flat=True)) == [override.reason]


@pytest.mark.django_db
def test_the_page_and_the_api_refuse_the_same_unhealthy_run_for_the_same_reason(client, two_teams):
    t = two_teams
    run = _run(t.a, "a-hot", 0.31)
    _finding(run, "throttling", "warning")
    client.force_login(t.alice)
    url = reverse("job-promote-baseline", args=["a-hot"])
    # A reason without "promote anyway" ticked is not an override on the page.
    page = client.post(url, {"reason": "clocks fine"}, follow=True).content.decode()
    assert "Not promoted: this run has hardware or health findings" in page
    assert t.as_alice.post("/api/v1/baselines/", {"job": "a-hot"}, format="json").status_code == 409
    assert not Baseline.objects.filter(team=t.a).exists()
    client.post(url, {"promote_anyway": "1", "reason": "clocks fine"})
    assert PromotionOverride.objects.get(job=run).reason == "clocks fine"


@pytest.mark.django_db
def test_a_member_of_another_team_cannot_promote_even_where_reads_are_open(two_teams, settings):
    t = two_teams
    settings.READ_SCOPE = "all"
    _run(t.b, "b3", 0.5)
    refused = t.as_alice.post("/api/v1/baselines/", {"job": "b3"}, format="json")
    assert refused.status_code == 403
    with pytest.raises(baselines.PromotionForbidden):
        baselines.promote(Job.objects.get(external_id="b3"), t.alice)
    assert t.b_baseline.runs.count() == 2


@pytest.mark.django_db
def test_staff_promote_a_run_into_the_runs_own_team_baseline(two_teams, make_user, api_client_for):
    t = two_teams
    admin = api_client_for(make_user("root", staff=True))
    _run(t.a, "a1", 0.25)
    response = admin.post("/api/v1/baselines/", {"job": "a1"}, format="json")
    assert response.status_code == 201 and response.json()["team"] == "llm"
    assert t.b_baseline.runs.count() == 2


@pytest.mark.django_db
def test_the_unhealthy_rule_reads_warning_or_worse_health_findings_only(two_teams):
    t = two_teams
    run = _run(t.a, "a1", 0.3)
    _finding(run, "gpu_errors", "info")
    _finding(run, "data_pipeline_stall", "critical")  # not a hardware/health code
    assert baselines.promote(run, t.alice).override is None
    other = _run(t.a, "a2", 0.3)
    _finding(other, "straggler", "warning")
    with pytest.raises(baselines.UnhealthyRun) as refused:
        baselines.promote(other, t.alice)
    assert refused.value.codes == ["straggler"]


class _Editor:
    """The part of a schema editor the data migration uses."""

    def execute(self, sql: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(sql)


@pytest.mark.django_db
def test_the_migration_splits_a_pooled_baseline_by_its_runs_teams(catalog, make_team, make_user):
    from importlib import import_module

    migration = import_module("jobs.migrations.0013_sso_identity")
    a, b = make_team("llm"), make_team("vision")
    bob = make_user("bob", teams=[b])
    a1, b1, b2 = _run(a, "a1", 0.20), _run(b, "b1", 0.50), _run(b, "b2", 0.52)
    # As before the team scope: B's baseline pooled A's run, with A's override.
    pooled = Baseline.objects.create(
        fingerprint=b1.config_fingerprint, model_name="llama-7b", team=b, stats={}, created_by=bob
    )
    pooled.runs.add(a1, b1, b2)
    PromotionOverride.objects.create(baseline=pooled, job=a1, reason="pooled", finding_codes=["throttling"])

    migration.split_by_team(live_apps, _Editor())

    pooled.refresh_from_db()
    assert sorted(pooled.runs.values_list("external_id", flat=True)) == ["b1", "b2"]
    assert pooled.stats["mfu"]["median"] == pytest.approx(0.51) and pooled.stats["mfu"]["n"] == 2
    split = Baseline.objects.get(team=a)
    assert list(split.runs.all()) == [a1] and split.retired_at is None
    assert split.fingerprint == pooled.fingerprint and split.stats["mfu"]["median"] == pytest.approx(0.20)
    assert PromotionOverride.objects.get().baseline == split


@pytest.mark.django_db
def test_the_admin_neither_adds_baselines_nor_edits_their_runs(admin_client, two_teams):
    t = two_teams
    a1 = _run(t.a, "a1", 0.2)
    assert admin_client.get("/admin/jobs/baseline/add/").status_code == 403
    url = f"/admin/jobs/baseline/{t.b_baseline.pk}/change/"
    assert admin_client.get(url).status_code == 200
    # Every field of the model, as a full form would post them: only retired_at is taken.
    form = {
        "fingerprint": "x",
        "model_name": "m",
        "team": t.a.pk,
        "config": "{}",
        "runs": [a1.pk],
        "stats": "{}",
        "created_by": "",
        "retired_at_0": "",
        "retired_at_1": "",
    }
    assert admin_client.post(url, form).status_code == 302  # saved
    t.b_baseline.refresh_from_db()
    assert t.b_baseline.team == t.b
    assert sorted(t.b_baseline.runs.values_list("external_id", flat=True)) == ["b1", "b2"]


@pytest.mark.django_db
def test_the_mfu_low_alert_band_comes_from_the_jobs_own_teams_baseline_only(two_teams):
    """The alert rules' baseline band (jobs.alerts.incidents) read any team's baseline of the fingerprint."""
    from jobs.alerts.incidents import _baseline_mfu_low

    t = two_teams
    a_running = _run(t.a, "a-live", 0.20, finished=False)
    assert _baseline_mfu_low(a_running) is None  # B's baseline (median 0.51) is not A's
    assert _baseline_mfu_low(_run(t.b, "b-live", 0.20, finished=False)) is not None
