"""Alert rules on simulated running jobs through a real Prometheus (backfilled with promtool), polled as in
production: each rule opens an incident, keeps the same one across polls, and resolves it."""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from jobs.alerts import incidents
from jobs.intake.registry import register_job
from jobs.metrics.prometheus import PrometheusClient
from jobs.models import AlertIncident, Job
from jobs.pipeline import poll as pipeline
from jobs.simulate import DEFAULT_START, SimSpec, backfill, registration_body, simulate, write_openmetrics
from tests.prom_server import PrometheusProcess, prometheus_binary

pytestmark = [pytest.mark.prometheus]
HOUR = 3600.0
START = datetime.fromtimestamp(DEFAULT_START, tz=UTC)


def _sample(sim, minutes: float) -> int:
    return int(np.searchsorted(sim.timestamps, DEFAULT_START + minutes * 60.0))


def _recover(sim, minutes: float, keys=("gpu_util",), value: float | None = None) -> None:
    """From `minutes` on, every GPU reads busy (GPU_UTIL 99 %) or, for counters, stops increasing."""
    k = _sample(sim, minutes)
    for key in keys:
        field = sim.fields[key]
        if value is not None:
            field[:, k:] = value
        else:  # a counter frozen at its value: rate 0
            field[:, k:] = field[:, k - 1 : k]


@pytest.fixture(scope="module")
def sims():
    idle = simulate(SimSpec(scenario="idle_gpus", gpus=8, job_id="3001", duration_s=2 * HOUR, seed=1,
                            hosts=("node-a",), params={"idle_from": 0.25}))  # fmt: skip
    _recover(idle, 60, value=99.0)  # idle from 30 min, busy again from 60 min
    throttled = simulate(SimSpec(scenario="throttling", gpus=8, job_id="3002", duration_s=2 * HOUR, seed=2,
                                 hosts=("node-b",)))  # fmt: skip
    _recover(throttled, 60, keys=("power_violation", "thermal_violation"))
    _recover(throttled, 60, keys=("sm_clock",), value=1940.0)
    xid = simulate(SimSpec(scenario="gpu_errors", gpus=8, job_id="3003", duration_s=2 * HOUR, seed=3,
                           hosts=("node-c",)))  # fmt: skip
    slow = simulate(SimSpec(scenario="launch_overhead", gpus=8, job_id="3004", duration_s=2 * HOUR, seed=4,
                            hosts=("node-d",)))  # fmt: skip
    straggler = simulate(SimSpec(scenario="straggler", gpus=8, job_id="3005", duration_s=2 * HOUR, seed=5,
                                 hosts=("node-e",)))  # fmt: skip
    healthy = simulate(SimSpec(scenario="healthy", gpus=8, job_id="3006", duration_s=2 * HOUR, seed=6,
                               hosts=("node-f",)))  # fmt: skip
    return {s.spec.job_id: s for s in (idle, throttled, xid, slow, straggler, healthy)}


@pytest.fixture(scope="module")
def prom(sims, tmp_path_factory):
    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (Debian package 'prometheus')")
    work = tmp_path_factory.mktemp("alerts-prom")
    om = work / "data.om"
    write_openmetrics(list(sims.values()), om)
    backfill(om, work / "tsdb")
    with PrometheusProcess(work / "tsdb") as server:
        yield server


@pytest.fixture
def fast_rules(settings):
    settings.ALERT_IDLE_MINUTES = 5
    settings.ALERT_MFU_MINUTES = 10
    settings.ALERT_THROTTLE_MINUTES = 5
    settings.ALERT_XID_MINUTES = 15
    settings.ALERT_STRAGGLER_MINUTES = 5
    settings.ALERT_WASTE_MINUTES = 5
    settings.ALERT_STALE_MINUTES = 10
    return settings


def _client(prom) -> PrometheusClient:
    return PrometheusClient(prom.url, timeout_s=10, retries=0)


def _job(sim, team) -> Job:
    return register_job(registration_body(sim, team=team, ended=False)).job


def _poll(job: Job, prom, minutes: float) -> Job:
    job.refresh_from_db()
    return pipeline.poll_job(job, _client(prom), now=START + timedelta(minutes=minutes))


def _incidents(job: Job, rule: str) -> list[AlertIncident]:
    return list(AlertIncident.objects.filter(job=job, rule=rule).order_by("pk"))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.django_db
def test_gpus_idle_after_activity_opens_stays_open_and_resolves(prom, sims, make_team, fast_rules):
    job = _job(sims["3001"], make_team("llm"))
    _poll(job, prom, 25)
    assert _incidents(job, "gpus_idle") == []  # busy until minute 30
    _poll(job, prom, 33)
    assert _incidents(job, "gpus_idle") == []  # idle for 3 min < 5: pending
    _poll(job, prom, 40)
    [opened] = _incidents(job, "gpus_idle")
    assert opened.is_open
    # Two of the 8 GPUs went idle at minute 30 (the run starts at the window the first idle sample closes).
    assert abs((opened.started_at - (START + timedelta(minutes=30))).total_seconds()) <= 60
    assert "idle" in opened.title
    assert opened.finding_code == "idle_gpus" and opened.finding is not None
    _poll(job, prom, 45)
    _poll(job, prom, 45)  # a repeated poll
    [same] = _incidents(job, "gpus_idle")
    assert same.pk == opened.pk and same.is_open and same.last_seen_at == START + timedelta(minutes=45)
    _poll(job, prom, 63)  # every GPU busy again from minute 60
    [resolved] = _incidents(job, "gpus_idle")
    assert resolved.pk == opened.pk and resolved.resolved_at == START + timedelta(minutes=63)


@pytest.mark.django_db
def test_throttling_opens_and_resolves_when_the_clocks_recover(prom, sims, make_team, catalog, fast_rules):
    job = _job(sims["3002"], make_team("llm"))
    _poll(job, prom, 20)
    [opened] = _incidents(job, "throttling")
    assert opened.is_open and opened.finding_code == "throttling"
    _poll(job, prom, 30)
    [same] = _incidents(job, "throttling")
    assert same.pk == opened.pk and same.is_open
    _poll(job, prom, 66)
    [resolved] = _incidents(job, "throttling")
    assert resolved.resolved_at is not None


@pytest.mark.django_db
def test_xid_errors_open_at_the_error_and_resolve_after_quiet_minutes(prom, sims, make_team, fast_rules):
    job = _job(sims["3003"], make_team("llm"))
    _poll(job, prom, 50)
    assert _incidents(job, "xid_errors") == []
    _poll(job, prom, 63)  # XID 94 on one GPU from minute 60 for ~10 min
    [opened] = _incidents(job, "xid_errors")
    assert opened.is_open
    _poll(job, prom, 68)
    [same] = _incidents(job, "xid_errors")
    assert same.pk == opened.pk and same.is_open
    _poll(job, prom, 90)  # no XID in the last 15 min
    [resolved] = _incidents(job, "xid_errors")
    assert resolved.resolved_at == START + timedelta(minutes=90)


@pytest.mark.django_db
def test_mfu_below_the_reference_opens_and_clears_with_the_threshold(prom, sims, make_team, fast_rules):
    job = _job(sims["3004"], make_team("llm"))  # MFU ~9 % against a 45 % reference
    _poll(job, prom, 30)
    [opened] = _incidents(job, "mfu_low")
    assert opened.is_open and "MFU" in opened.title
    _poll(job, prom, 35)
    assert [i.pk for i in _incidents(job, "mfu_low")] == [opened.pk]
    fast_rules.ALERT_MFU_REFERENCE_SHARE = 0.1  # limit 4.5 %: the condition clears
    _poll(job, prom, 40)
    [resolved] = _incidents(job, "mfu_low")
    assert resolved.resolved_at is not None


@pytest.mark.django_db
def test_straggler_and_waste_rules_follow_the_findings(prom, sims, make_team, fast_rules):
    job = _job(sims["3005"], make_team("llm"))
    fast_rules.ALERT_WASTE_USD_PER_DAY = 1.0
    _poll(job, prom, 30)
    [straggler] = _incidents(job, "straggler")
    assert straggler.is_open and straggler.finding is not None and straggler.finding.code == "straggler"
    [waste] = _incidents(job, "waste")
    assert waste.is_open and waste.finding is not None
    assert (waste.finding.waste_per_day_usd or 0) > 1.0
    _poll(job, prom, 35)
    assert len(_incidents(job, "straggler")) == 1 and len(_incidents(job, "waste")) == 1
    fast_rules.ALERT_STRAGGLER_MIN_CONFIDENCE = 1.0
    fast_rules.ALERT_WASTE_USD_PER_DAY = 1e9
    _poll(job, prom, 40)
    assert _incidents(job, "straggler")[0].resolved_at is not None
    assert _incidents(job, "waste")[0].resolved_at is not None


@pytest.mark.django_db
def test_ingestion_stale_opens_from_the_sweep_and_resolves_on_the_next_poll(
    prom, sims, make_team, fast_rules
):
    job = _job(sims["3006"], make_team("llm"))
    _poll(job, prom, 30)
    down = PrometheusClient(f"http://127.0.0.1:{_closed_port()}", timeout_s=1, retries=0)
    job.refresh_from_db()
    pipeline.poll_job(job, down, now=START + timedelta(minutes=45))  # fails: no hook runs, the sweep does
    incidents.sweep(now=START + timedelta(minutes=45))
    [opened] = _incidents(job, "ingestion_stale")
    # Since the last archived data: the poll at minute 30 archived up to now minus the ingestion lag.
    lag = timedelta(seconds=fast_rules.PROMETHEUS_INGESTION_LAG_S)
    assert opened.is_open and opened.started_at == START + timedelta(minutes=30) - lag
    incidents.sweep(now=START + timedelta(minutes=46))
    assert len(_incidents(job, "ingestion_stale")) == 1
    _poll(job, prom, 50)
    [resolved] = _incidents(job, "ingestion_stale")
    assert resolved.resolved_at == START + timedelta(minutes=50)
    # A healthy job opens nothing else.
    assert set(AlertIncident.objects.filter(job=job).values_list("rule", flat=True)) == {"ingestion_stale"}


@pytest.mark.django_db
def test_an_ended_job_has_its_incidents_resolved(prom, sims, make_team, fast_rules):
    job = _job(sims["3001"], make_team("llm"))
    _poll(job, prom, 40)
    assert _incidents(job, "gpus_idle")[0].is_open
    Job.objects.filter(pk=job.pk).update(status=Job.Status.ENDED, ended_at=START + timedelta(minutes=41))
    incidents.sweep(now=START + timedelta(minutes=42))
    [resolved] = _incidents(job, "gpus_idle")
    assert resolved.resolved_at is not None and resolved.resolve_reason == "the job ended"


@pytest.mark.django_db
def test_idle_policy_runs_from_the_poll_in_dry_run(
    prom, sims, make_team, make_user, fast_rules, celery_eager
):
    from django.core import mail

    from jobs.models import IdlePolicy, PolicyAction

    fast_rules.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    fast_rules.IDLE_POLICY_TEAMS = ["llm"]
    fast_rules.IDLE_POLICY_COMMAND = "/bin/false"
    team = make_team("llm")
    make_user("alice", teams=[team])
    IdlePolicy.objects.create(team=team, enabled=True, dry_run=True, warn_after_minutes=8, grace_minutes=3)
    job = _job(sims["3001"], team)
    # As the cluster's scheduler registered it: only such jobs may be cancelled (jobs.access.ownership, issue
    # 23).
    Job.objects.filter(pk=job.pk).update(owner="alice", registered_by="scheduler", cluster="slurm-a")
    _poll(job, prom, 40)  # idle since minute 30: incident open, owner warned
    assert [a.kind for a in PolicyAction.objects.filter(job=job)] == ["warn"]
    assert (
        len(mail.outbox) == 1 and "48213" not in mail.outbox[0].subject and "3001" in mail.outbox[0].subject
    )
    _poll(job, prom, 44)  # grace over: the dry run logs the cancel it would make
    cancel = PolicyAction.objects.get(job=job, kind="cancel")
    assert cancel.outcome == "dry_run" and cancel.action == "/bin/false 3001"
    _poll(job, prom, 45)
    assert PolicyAction.objects.filter(job=job).count() == 2
