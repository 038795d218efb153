"""Findings ranked by what a user should act on (issue 28 item 1): specific causes above the unexplained
remainder, most $/day first, ties broken by severity then confidence; one order in Python and in SQL."""

from __future__ import annotations

import random
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.diagnosis.base import REMAINDER_CODE, Severity, rank_key
from jobs.diagnosis.engine import sentence_case
from jobs.models import Finding, GpuModel, Job, PriceEntry


def test_remainder_ranks_below_a_cheaper_specific_cause():
    # The case: "$510/day of waste that no finding explains" at 30 % was #1 above host_device_copy.
    remainder = rank_key(REMAINDER_CODE, 510.0, "warning", 0.3)
    cause = rank_key("host_device_copy", 73.0, "warning", 0.9)
    assert sorted([remainder, cause]) == [cause, remainder]


def test_equal_dollars_rank_the_more_severe_then_the_more_confident_first():
    # The tie: false_saturation (info, 20 %) sorted above a critical baseline_regression at 90 %.
    weak = rank_key("false_saturation", None, "info", 0.2)
    critical = rank_key("baseline_regression", None, "critical", 0.9)
    assert min(weak, critical) == critical
    confident = rank_key("b_code", 10.0, "warning", 0.9)
    unsure = rank_key("a_code", 10.0, "warning", 0.3)
    assert min(confident, unsure) == confident


def test_unknown_dollars_rank_below_zero_dollars():
    assert rank_key("a", 0.0, "info", 0.1) < rank_key("b", None, "critical", 0.9)


def test_titles_are_sentences():
    assert (
        sentence_case("mfu 51 % worse than this config's baseline")
        == "Mfu 51 % worse than this config's baseline"
    )
    assert sentence_case("XID error 79 during the job") == "XID error 79 during the job"
    assert sentence_case("") == ""


def _job(team, external_id: str = "r1") -> Job:
    now = timezone.now()
    # $3.125/GPU-h on demand: the $600/day of 8 GPUs; the team page and leaderboard price jobs from the book.
    gpu, created = GpuModel.objects.get_or_create(name="Rank test GPU")
    if created:
        PriceEntry.objects.create(
            gpu_model=gpu, tier="on_demand", usd_per_gpu_hour=3.125, effective_from=now - timedelta(days=90)
        )
    return Job.objects.create(
        team=team, gpu_model=gpu, external_id=external_id, name=f"job-{external_id}",
        started_at=now - timedelta(hours=5), ended_at=now - timedelta(hours=1), gpu_count=8, gpu_hours=32.0,
        mfu=0.3, cost_usd=100.0,
        cost_per_day_usd=600.0, waste_per_day_usd=583.0, waste_lower_bound_per_day_usd=583.0,
        status=Job.Status.FINALIZED, config_fingerprint="f" * 64, model_name="llama-7b",
        last_polled_at=now - timedelta(hours=1),
    )  # fmt: skip


def _finding(
    job: Job, code: str, usd: float | None, severity: str, confidence: float, title: str = ""
) -> Finding:
    return Finding.objects.create(
        job=job, code=code, severity=severity, confidence=confidence, title=title or f"Title of {code}",
        recommendation=f"Fix for {code}.", waste_per_day_usd=usd, evidence=[],
    )  # fmt: skip


@pytest.mark.django_db
def test_sql_order_equals_the_python_rank_key(make_team):
    job = _job(make_team("llm"))
    rng = random.Random(7)
    codes = ["idle_gpus", "throttling", "host_sync", "straggler", "false_saturation", "baseline_regression",
             "memory_bound", "launch_overhead", "gpu_errors", REMAINDER_CODE]  # fmt: skip
    for code in codes:
        usd = rng.choice([None, 0.0, 12.5, 12.5, 73.0, 510.0])
        _finding(job, code, usd, rng.choice(list(Severity)).value, rng.choice([0.2, 0.5, 0.9]))
    from_sql = [f.code for f in job.findings.all()]
    from_python = [
        f.code
        for f in sorted(
            Finding.objects.filter(job=job),
            key=lambda f: rank_key(f.code, f.waste_per_day_usd, f.severity, f.confidence),
        )
    ]
    assert from_sql == from_python
    assert from_sql[-1] == REMAINDER_CODE


@pytest.mark.django_db
def test_job_page_lists_causes_first_and_the_remainder_once_as_a_footer(client, make_team, make_user):
    team = make_team("llm")
    client.force_login(make_user("alice", teams=[team]))
    job = _job(team)
    _finding(job, REMAINDER_CODE, 510.0, "warning", 0.3, "Waste that no finding explains")
    _finding(job, "host_device_copy", 73.0, "warning", 0.9, "Host-device copies stall the GPUs")
    html = client.get(f"/jobs/{job.external_id}/").content.decode()
    findings = html[html.index('id="findings"') :]
    findings = findings[: findings.index("</section>")]
    assert findings.index("Host-device copies stall the GPUs") < findings.index(
        "not explained by the findings above"
    )
    assert "Waste that no finding explains" not in findings  # not a list item with its own title
    assert re.search(r"\$510(\.00)?/day</strong> not explained by the findings above; to find out:", findings)
    assert findings.count(f'id="finding-{REMAINDER_CODE}"') == 1


@pytest.mark.django_db
def test_main_finding_on_team_page_and_leaderboard_is_the_top_specific_one(client, make_team, make_user):
    team = make_team("llm")
    client.force_login(make_user("alice", teams=[team]))
    job = _job(team)
    _finding(job, REMAINDER_CODE, 510.0, "warning", 0.3, "Waste that no finding explains")
    _finding(job, "idle_gpus", 73.0, "critical", 0.9, "2 of 8 GPUs idle for 25 min or more")
    for url in ("/teams/llm/", "/leaderboard/"):
        html = client.get(url).content.decode()
        assert "2 of 8 GPUs idle for 25 min or more" in html, url
        assert "Waste that no finding explains" not in html, url
