"""Verified ownership (issue 23 items 1-2): each attack a hostile team member tried, as a test that is now
refused or harmless, and the rules behind them (jobs.access.ownership): who may claim an id, GPUs, a selector
and
an owner; what the idle policy may cancel and how (Kubernetes: the owning Job/JobSet, never the pod)."""

from __future__ import annotations

import importlib
import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from efficiency.env import EnvError, env_job_labels
from jobs.access.ownership import cancel_refusal, declared_time_sliced, gpu_key, identity_labels
from jobs.alerts import policy
from jobs.evaluation import sharing
from jobs.models import AlertIncident, ApiToken, IdlePolicy, Job, JobSeries, PolicyAction
from tests.conftest import job_body

GPUS = [{"hostname": "gpu-node-017", "gpu": str(i)} for i in range(8)]


def _client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


@pytest.fixture
def world(make_team, make_user, api_client_for):
    """Two teams: mallory in llm (the attacker), bob in vision (the victim); each cluster's scheduler
    credential filed under a service account in no team."""
    llm, vision = make_team("llm"), make_team("vision")
    mallory, bob = make_user("mallory", teams=[llm]), make_user("bob", teams=[vision])
    _, slurm_a = ApiToken.issue(make_user("svc-a"), "prolog a", kind="scheduler", cluster="slurm-a")
    _, slurm_b = ApiToken.issue(make_user("svc-b"), "prolog b", kind="scheduler", cluster="slurm-b")
    return {
        "llm": llm,
        "vision": vision,
        "mallory": api_client_for(mallory),
        "bob": api_client_for(bob),
        "slurm_a": _client(slurm_a),
        "slurm_b": _client(slurm_b),
    }


def _started(hours: float = 2) -> str:
    return (timezone.now() - timedelta(hours=hours)).isoformat()


def _victim(world, external_id: str = "48999", **overrides) -> Job:
    """Bob's job as the vision cluster's scheduler registers it (explicit GPUs on gpu-node-017)."""
    body = job_body(external_id, team="vision", owner="bob", started_at=_started(), **overrides)
    answer = world["slurm_a"].post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 201, answer.json()
    return Job.objects.get(external_id=external_id)


def _policy(team, settings, tmp_path) -> Path:
    """The team's idle policy at its most aggressive (1 min warning, no grace), allowed and not a dry run;
    IDLE_POLICY_COMMAND records what it is asked to cancel."""
    calls = tmp_path / "cancelled"
    hook = tmp_path / "cancel.sh"
    hook.write_text(f'#!/bin/sh\necho "$1" >> "{calls}"\n')
    hook.chmod(0o755)
    settings.IDLE_POLICY_COMMAND = str(hook)
    settings.IDLE_POLICY_TEAMS = [team.slug]
    settings.IDLE_POLICY_DRY_RUN = False
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    IdlePolicy.objects.create(team=team, enabled=True, dry_run=False, warn_after_minutes=1, grace_minutes=0)
    return calls


def _idle(job: Job, now) -> AlertIncident:
    return AlertIncident.objects.create(
        rule="gpus_idle", job=job, team=job.team, started_at=now - timedelta(minutes=5), opened_at=now,
        last_seen_at=now, title="8 of 8 GPUs idle for 5 min", finding_code="idle_gpus",
    )  # fmt: skip


# --------------------------------------------------------------------------------- attacks 1 and 6


@pytest.mark.django_db
def test_a_member_cannot_take_a_scheduler_jobs_id_and_the_refusal_names_no_team(world):
    _victim(world)
    attack = job_body("48999", team="llm", owner="", started_at=_started())
    answer = world["mallory"].post("/api/v1/jobs/", attack, format="json")
    assert answer.status_code == 409
    text = json.dumps(answer.json())
    assert "vision" not in text and "bob" not in text
    # The same answer as for an id another team registered by hand: it confirms no team's ids.
    elsewhere = [{"hostname": "n9", "gpu": "0"}]
    theirs = job_body("51000", team="vision", owner="bob", started_at=_started(), gpus=elsewhere)
    assert world["bob"].post("/api/v1/jobs/", theirs, format="json").status_code == 201
    other = world["mallory"].post(
        "/api/v1/jobs/", job_body("51000", team="llm", owner="", started_at=_started()), format="json"
    )
    assert other.status_code == 409 and other.json() == {
        "external_id": [answer.json()["external_id"][0].replace("48999", "51000")]
    }
    job = Job.objects.get(external_id="48999")
    assert (job.team.slug, job.owner, job.registered_by) == ("vision", "bob", "scheduler")
    summary = world["slurm_a"].get("/api/v1/jobs/48999/").json()
    assert (summary["registered_by"], summary["cluster"]) == ("scheduler", "slurm-a")


@pytest.mark.django_db
def test_a_member_naming_another_teams_user_as_owner_is_refused(world):
    attack = job_body("48999", team="llm", owner="bob", started_at=_started())
    answer = world["mallory"].post("/api/v1/jobs/", attack, format="json")
    assert answer.status_code == 400 and "owner" in answer.json()
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_the_idle_policy_never_cancels_a_hand_registered_job_only_warns(world, settings, tmp_path):
    # Mallory registers bob's scheduler id before the prolog does, under her own name and team, and sets
    # her team's policy to 1 minute / no grace: today the next poll ran `scancel 48999` on bob's job.
    calls = _policy(world["llm"], settings, tmp_path)
    body = job_body("48999", team="llm", owner="mallory", started_at=_started())
    assert world["mallory"].post("/api/v1/jobs/", body, format="json").status_code == 201
    job = Job.objects.get(external_id="48999")
    assert job.registered_by == "member"
    now = timezone.now()
    _idle(job, now)
    policy.apply(job.pk, now)
    actions = policy.apply(job.pk, now + timedelta(minutes=1))
    cancel = next(a for a in actions if a.kind == "cancel")
    assert cancel.outcome == "refused" and "registered by hand" in cancel.reason
    assert "not registered by a scheduler" in cancel.actor and "of mallory" in cancel.actor
    assert not calls.exists()  # nothing was cancelled
    assert "will not cancel it" in mail.outbox[0].body
    # The team's alerts page says which jobs the policy may cancel, and its log says why this one was not.
    page = Client()
    page.force_login(get_user_model().objects.get(username="mallory"))
    html = page.get("/teams/llm/alerts/").content.decode()
    assert "Only jobs a scheduler integration registered" in html and "not registered by a scheduler" in html


@pytest.mark.django_db
def test_the_scheduler_takes_over_a_hand_registered_id_and_the_real_owner_is_not_blocked(world, caplog):
    hand = job_body(
        "48999", team="llm", owner="mallory", started_at=_started(), gpus=[{"hostname": "x", "gpu": "0"}]
    )
    assert world["mallory"].post("/api/v1/jobs/", hand, format="json").status_code == 201
    point = {"timestamp": _started(1), "step": 10, "tokens": 10**9}
    assert world["mallory"].post("/api/v1/jobs/48999/progress/", point, format="json").status_code == 202
    # Bob's own registration is refused without saying which team holds the id (it used to say
    # "registered to another team"); the scheduler's registration is what settles it.
    bobs = world["bob"].post("/api/v1/jobs/", job_body("48999", team="vision", owner="bob"), format="json")
    assert bobs.status_code == 409 and "llm" not in json.dumps(bobs.json())
    with caplog.at_level("WARNING", logger="jobs.access.ownership"):
        job = _victim(world)  # 201: team and GPUs contradict the hand registration, which is discarded
    assert (job.team.slug, job.owner, job.gpus, job.registered_by, job.cluster) == (
        "vision", "bob", GPUS, "scheduler", "slurm-a",
    )  # fmt: skip
    assert "taken over" in caplog.text and "mallory" in caplog.text and "discarded" in caplog.text
    assert not job.progress.exists()  # mallory's pushed progress was not handed to bob's job
    # Now bob (a member of vision) may describe it, and mallory cannot get it back.
    again = job_body("48999", team="vision", owner="bob", started_at=job.started_at.isoformat(), dtype="fp16")
    assert world["bob"].post("/api/v1/jobs/", again, format="json").status_code == 200
    assert world["mallory"].post("/api/v1/jobs/", hand, format="json").status_code == 409


@pytest.mark.django_db
def test_the_idle_policy_cancels_a_scheduler_job_and_logs_the_credential(world, settings, tmp_path):
    calls = _policy(world["vision"], settings, tmp_path)
    job = _victim(world)
    now = timezone.now()
    _idle(job, now)
    policy.apply(job.pk, now)
    cancel = next(a for a in policy.apply(job.pk, now + timedelta(minutes=1)) if a.kind == "cancel")
    assert cancel.outcome == "done", cancel.detail
    assert "scheduler token 'prolog a'" in cancel.actor and "cluster slurm-a" in cancel.actor
    assert calls.read_text().split() == ["48999"]


@pytest.mark.parametrize("provenance", ["member", "discovery", "staff", "import", "demo"])
def test_only_scheduler_jobs_are_cancellable(provenance):
    assert cancel_refusal("scheduler") is None
    assert cancel_refusal(provenance).startswith("not cancelled")


# ------------------------------------------------------------------------------------------ attack 2


@pytest.mark.django_db
def test_claiming_gpus_another_teams_running_job_holds_is_refused_409(world):
    _victim(world)
    attack = job_body("60001", team="llm", owner="mallory", started_at=_started(1), gpus=GPUS[:3])
    answer = world["mallory"].post("/api/v1/jobs/", attack, format="json")
    assert answer.status_code == 409 and "gpus" in answer.json()
    text = json.dumps(answer.json())
    assert "48999" not in text and "vision" not in text and "gpu-node-017/0" in text


@pytest.mark.django_db
def test_a_running_job_whose_data_stopped_an_hour_ago_no_longer_holds_its_gpus(world):
    victim = _victim(world)
    Job.objects.filter(pk=victim.pk).update(data_until=timezone.now() - timedelta(hours=3))  # lost epilog
    claim = job_body("60001", team="llm", owner="mallory", started_at=_started(1), gpus=GPUS[:3])
    assert world["mallory"].post("/api/v1/jobs/", claim, format="json").status_code == 201


@pytest.mark.django_db
def test_existing_jobs_get_their_provenance_in_the_migration(world):
    from django.apps import apps

    migration = importlib.import_module("jobs.migrations.0012_ownership")
    found = Job.objects.create(
        team=world["llm"], external_id="hpc_job:7", gpu_count=1, started_at=timezone.now(),
        discovered_by='hpc_job="7"', registered_by="scheduler",
    )  # fmt: skip
    posted = Job.objects.create(
        team=world["llm"], external_id="7", gpu_count=1, started_at=timezone.now(), registered_by="scheduler"
    )
    migration.provenance_of_existing_jobs(apps, None)
    found.refresh_from_db()
    posted.refresh_from_db()
    assert (found.registered_by, posted.registered_by) == ("discovery", "member")


@pytest.mark.django_db
def test_gpus_a_selector_job_was_seen_on_are_held_too(world):
    body = job_body("48999", team="vision", owner="bob", started_at=_started(), gpus=None, gpu_count=1)
    body.pop("gpus")
    body["selector"] = {"hpc_job": "48999"}
    assert world["slurm_a"].post("/api/v1/jobs/", body, format="json").status_code == 201
    now = timezone.now()
    JobSeries.objects.create(
        job=Job.objects.get(external_id="48999"), signal="gpu_util", stat="gpu", gpu_key="gpu-node-017/5",
        step_seconds=60, start=now - timedelta(hours=4), end=now - timedelta(minutes=2), values=b"",
    )  # fmt: skip
    attack = job_body("60001", team="llm", owner="mallory", started_at=_started(1), gpus=GPUS[5:6])
    assert world["mallory"].post("/api/v1/jobs/", attack, format="json").status_code == 409


@pytest.mark.django_db
def test_gpus_the_platform_declares_time_sliced_may_be_claimed(world, settings):
    _victim(world)
    settings.TIME_SLICED_GPUS = ["gpu-node-017/*"]
    attack = job_body("60001", team="llm", owner="mallory", started_at=_started(1), gpus=GPUS[:3])
    assert world["mallory"].post("/api/v1/jobs/", attack, format="json").status_code == 201


def _claim(team, external_id, provenance, gpus, start, now):
    return Job.objects.create(
        team=team, external_id=external_id, gpu_count=len(gpus), gpus=gpus, started_at=start,
        data_until=now, registered_by=provenance,
    )  # fmt: skip


@pytest.mark.django_db
def test_a_hand_registered_overlapping_claim_never_lowers_another_teams_share(world, settings):
    now = timezone.now()
    start = now - timedelta(hours=2)
    victim = _claim(world["vision"], "48999", "scheduler", GPUS, start, now)
    # Registered before the victim's registration existed (or on a declared node): harmless at poll time.
    _claim(world["llm"], "60001", "member", GPUS[:3], start, now)
    settings.TIME_SLICED_GPUS = []
    report = sharing.attribute_shares(victim, sharing.look_up(victim, None, now), now)
    assert report.shared == [] and report.share == pytest.approx(1.0)
    settings.TIME_SLICED_GPUS = ["gpu-node-017/*"]  # even on a GPU the platform declares time-sliced
    report = sharing.attribute_shares(victim, sharing.look_up(victim, None, now), now)
    assert report.shared == [] and report.share == pytest.approx(1.0)
    assert sharing.summarise(report, 8, None) is None  # not "time-sliced, charged 3.21 of 8 GPUs"


@pytest.mark.django_db
def test_gpu_sharing_is_attributed_only_on_a_gpu_the_platform_declares_shared(world, settings):
    now = timezone.now()
    start = now - timedelta(hours=2)
    victim = _claim(world["vision"], "48999", "scheduler", GPUS[:1], start, now)
    _claim(world["llm"], "70001", "scheduler", GPUS[:1], start, now)  # the scheduler double-booked it
    settings.TIME_SLICED_GPUS = []
    assert sharing.attribute_shares(victim, sharing.look_up(victim, None, now), now).share == pytest.approx(
        1.0
    )
    settings.TIME_SLICED_GPUS = ["gpu-node-017/0"]
    report = sharing.attribute_shares(victim, sharing.look_up(victim, None, now), now)
    assert [s.other_job for s in report.shared] == ["70001"] and report.share == pytest.approx(0.5)
    # Charged half, but the other team's job is not named on the page or in the finding (read policy).
    summary = sharing.summarise(report, 1, None)
    assert summary is not None and "70001" not in summary.label and "1 job of other teams" in summary.label
    assert [s.shown for s in summary.shared] == ["another team's job"]


def test_time_slicing_declarations_match_host_index_or_uuid_globs():
    assert declared_time_sliced("node-t3/1", ["node-t*/*"])
    assert not declared_time_sliced("node-a/1", ["node-t*/*"])
    assert declared_time_sliced("GPU-1234", ["GPU-12*"])
    assert gpu_key({"hostname": "n", "gpu": "07"}) == "n/7"


# ------------------------------------------------------------------------------------------ attack 3


@pytest.mark.django_db
@pytest.mark.parametrize("label", ["job", "exported_job"])
def test_the_scrape_job_label_is_refused_as_a_job_identity(world, label):
    body = job_body("dcgm-exporter", team="llm", owner="mallory", started_at=_started(), gpu_count=8)
    body.pop("gpus")
    body["selector"] = {label: "dcgm-exporter"}
    answer = world["mallory"].post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 400 and "selector" in answer.json()
    assert not Job.objects.exists()


def test_the_scrape_job_label_is_refused_in_the_setting():
    assert env_job_labels("SELECTOR_JOB_LABELS", ["hpc_job"], env={}) == ["hpc_job"]
    for bad in ("hpc_job,job", "exported_job", "pod,bad-label"):
        with pytest.raises(EnvError):
            env_job_labels("SELECTOR_JOB_LABELS", [], env={"SELECTOR_JOB_LABELS": bad})
    with pytest.raises(EnvError):
        env_job_labels("SELECTOR_JOB_LABELS", [], env={"SELECTOR_JOB_LABELS": " , "})
    # A list set in code (tests, settings overrides) is filtered by the same rule.
    assert identity_labels(["job", "hpc_job", "exported_job"]) == ["hpc_job"]


def test_the_default_job_identity_labels_exclude_the_scrape_job_label(settings):
    assert "job" not in settings.SELECTOR_JOB_LABELS and "exported_job" not in settings.SELECTOR_JOB_LABELS


# -------------------------------------------------------------------------------------- attacks 4, 5


@pytest.mark.django_db
def test_more_explicit_gpus_than_max_job_gpus_are_refused_400(world):
    gpus = [{"hostname": f"n{i // 8}", "gpu": str(i % 8)} for i in range(5000)]
    answer = world["mallory"].post(
        "/api/v1/jobs/",
        job_body("60002", team="llm", owner="", started_at=_started(), gpus=gpus),
        format="json",
    )
    assert answer.status_code == 400 and "MAX_JOB_GPUS" in json.dumps(answer.json())
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_running_job_older_than_max_running_job_days_is_refused(world, settings):
    assert settings.MAX_RUNNING_JOB_DAYS == 30
    old = (timezone.now() - timedelta(days=89)).isoformat()
    answer = world["mallory"].post(
        "/api/v1/jobs/", job_body("60003", team="llm", started_at=old), format="json"
    )
    assert answer.status_code == 400 and "MAX_RUNNING_JOB_DAYS" in json.dumps(answer.json())
    # The same window, ended, is a finished job (MAX_JOB_WINDOW_DAYS = 90 allows it)...
    ended = job_body("60003", team="llm", owner="", started_at=old, ended_at=_started(1))
    assert world["mallory"].post("/api/v1/jobs/", ended, format="json").status_code == 201
    # ...and cannot be re-opened as running.
    reopen = world["mallory"].patch("/api/v1/jobs/60003/", {"ended_at": None}, format="json")
    assert reopen.status_code == 400 and "MAX_RUNNING_JOB_DAYS" in json.dumps(reopen.json())


# ---------------------------------------------------------------------------------- identity & scope


@pytest.mark.django_db
def test_a_member_cannot_change_a_scheduler_jobs_identity_but_may_describe_it(world):
    body = job_body("48999", team="llm", owner="mallory", started_at=_started())
    assert world["slurm_a"].post("/api/v1/jobs/", body, format="json").status_code == 201
    for change in ({"gpus": GPUS[:4]}, {"owner": "other"}, {"team": "vision"}):
        answer = world["mallory"].post("/api/v1/jobs/", {**body, **change}, format="json")
        assert answer.status_code in (403, 409), (change, answer.json())
    described = world["mallory"].post("/api/v1/jobs/", {**body, "dtype": "fp16"}, format="json")
    assert described.status_code == 200
    job = Job.objects.get()
    assert (job.dtype, job.gpus, job.owner, job.registered_by) == ("fp16", GPUS, "mallory", "scheduler")


@pytest.mark.django_db
def test_a_scheduler_credential_is_scoped_to_its_cluster(world):
    job = _victim(world)
    # Another cluster's scheduler cannot take it, read it or end it.
    taken = world["slurm_b"].post("/api/v1/jobs/", job_body("48999", team="llm", owner="x"), format="json")
    assert taken.status_code == 409
    assert world["slurm_b"].get("/api/v1/jobs/48999/").status_code == 404
    end = {"ended_at": timezone.now().isoformat()}
    assert world["slurm_b"].patch("/api/v1/jobs/48999/", end, format="json").status_code == 404
    # Its own cluster's scheduler ends it, whatever the team (the service account is in no team).
    assert world["slurm_a"].patch("/api/v1/jobs/48999/", end, format="json").status_code == 200
    job.refresh_from_db()
    assert job.ended_at is not None
    # A scheduler speaks for its own cluster only; a member never declares one.
    wrong = job_body("48998", team="vision", cluster="slurm-b", started_at=_started())
    assert world["slurm_a"].post("/api/v1/jobs/", wrong, format="json").status_code == 400
    member = job_body("48997", team="llm", owner="", cluster="slurm-a", started_at=_started())
    assert world["mallory"].post("/api/v1/jobs/", member, format="json").status_code == 403


@pytest.mark.django_db
def test_issue_token_makes_a_cluster_scoped_scheduler_credential(make_user):
    out = StringIO()
    call_command(
        "issue_token",
        "--scheduler",
        "--cluster",
        "slurm-a",
        "--name",
        "prolog",
        stdout=out,
        stderr=StringIO(),
    )
    token = ApiToken.objects.get(key_hash=ApiToken.hash_key(out.getvalue().strip()))
    assert (token.kind, token.cluster, token.user.username) == ("scheduler", "slurm-a", "scheduler-slurm-a")
    assert not token.user.has_usable_password() and not token.user.is_staff
    with pytest.raises(CommandError):
        call_command(
            "issue_token", "--scheduler", "--name", "no cluster", stdout=StringIO(), stderr=StringIO()
        )
    with pytest.raises(ValueError):
        ApiToken.issue(make_user("x"), "t", kind="scheduler", cluster=" ")


# ------------------------------------------------------------------------------- Kubernetes cancels


class _FakeKube:
    """A tiny Kubernetes API: pods owned by Jobs, Jobs optionally owned by a JobSet; records every call and
    answers PATCH with `patch_status`."""

    def __init__(self, owners: dict[str, list[dict]], jobset: str = "", patch_status: int = 200) -> None:
        self.calls: list[tuple[str, str, str]] = []
        fake = self

        class Api(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode() if length else ""
                fake.calls.append((self.command, self.path, body))
                status, obj = 200, {}
                if "/pods/" in self.path:
                    name = self.path.rsplit("/", 1)[1]
                    obj = {"kind": "Pod", "metadata": {"name": name, "ownerReferences": owners.get(name, [])}}
                elif "/jobs/" in self.path and self.command == "GET":
                    refs = [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": jobset,
                             "controller": True}] if jobset else []  # fmt: skip
                    obj = {"kind": "Job", "metadata": {"ownerReferences": refs}}
                elif self.command == "PATCH":
                    status = patch_status
                payload = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_PATCH = do_DELETE = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _k8s_cancel(world, settings, tmp_path, kube: _FakeKube) -> PolicyAction:
    _policy(world["vision"], settings, tmp_path)
    token = tmp_path / "sa-token"
    token.write_text("sa\n")
    settings.IDLE_POLICY_K8S_API = kube.url
    settings.IDLE_POLICY_K8S_TOKEN_FILE = str(token)
    settings.IDLE_POLICY_K8S_CA_FILE = str(tmp_path / "no-ca")
    IdlePolicy.objects.filter(team=world["vision"]).update(action="kubernetes")
    body = job_body("pretrain-7b-x1", team="vision", owner="bob", started_at=_started(), gpu_count=8)
    body.pop("gpus")
    body["selector"] = {"namespace": "llm", "pod": "pretrain-7b-x1"}
    assert world["slurm_a"].post("/api/v1/jobs/", body, format="json").status_code == 201
    job = Job.objects.get()
    now = timezone.now()
    _idle(job, now)
    try:
        policy.apply(job.pk, now)
        return next(a for a in policy.apply(job.pk, now + timedelta(minutes=1)) if a.kind == "cancel")
    finally:
        kube.close()


OWNED = {
    "pretrain-7b-x1": [{"apiVersion": "batch/v1", "kind": "Job", "name": "pretrain-7b", "controller": True}]
}


@pytest.mark.django_db
def test_kubernetes_cancel_suspends_the_owning_jobset_not_the_pod(world, settings, tmp_path):
    kube = _FakeKube(OWNED, jobset="pretrain-7b-set")
    cancel = _k8s_cancel(world, settings, tmp_path, kube)
    assert cancel.outcome == "done" and cancel.detail == "suspended JobSet llm/pretrain-7b-set"
    assert [(m, p) for m, p, _ in kube.calls] == [
        ("GET", "/api/v1/namespaces/llm/pods/pretrain-7b-x1"),
        ("GET", "/apis/batch/v1/namespaces/llm/jobs/pretrain-7b"),
        ("PATCH", "/apis/jobset.x-k8s.io/v1alpha2/namespaces/llm/jobsets/pretrain-7b-set"),
    ]
    assert json.loads(kube.calls[-1][2]) == {"spec": {"suspend": True}}
    assert "PATCH" in cancel.action and not any(m == "DELETE" for m, _, _ in kube.calls)


@pytest.mark.django_db
def test_kubernetes_cancel_deletes_the_owning_job_when_suspend_is_refused(world, settings, tmp_path):
    kube = _FakeKube(OWNED, patch_status=422)
    cancel = _k8s_cancel(world, settings, tmp_path, kube)
    assert cancel.outcome == "done" and cancel.detail.startswith("deleted Job llm/pretrain-7b")
    assert kube.calls[-1][:2] == (
        "DELETE",
        "/apis/batch/v1/namespaces/llm/jobs/pretrain-7b?propagationPolicy=Background",
    )


@pytest.mark.django_db
def test_kubernetes_cancel_leaves_a_pod_without_an_owning_job_alone(world, settings, tmp_path):
    kube = _FakeKube({})
    cancel = _k8s_cancel(world, settings, tmp_path, kube)
    assert cancel.outcome == "failed" and "no owning Job" in cancel.detail
    assert [m for m, _, _ in kube.calls] == ["GET"]
