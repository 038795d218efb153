"""What the job page says when no rule fires, and what it says about the signals' resolution."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.diagnosis.regimes import RESOLVED_MIN_SAMPLES
from jobs.models import Job
from jobs.views.job import resolution


@pytest.fixture
def job(make_team, catalog):
    now = timezone.now()
    return Job.objects.create(
        external_id="quiet-1", team=make_team("llm"), gpu_count=8, started_at=now - timedelta(hours=2),
        last_polled_at=now, data_until=now,
    )  # fmt: skip


@pytest.fixture
def member(make_user, job):
    return make_user("alice", teams=[job.team])


def test_resolution_is_the_coarser_of_scrape_and_archive_step_as_the_diagnosis_uses_it(settings):
    settings.PROMETHEUS_SCRAPE_INTERVAL_S = 15
    # The coarser of scrape (15 s) and archive step (60 s) is 60 s; a shape needs 4 samples: 240 s.
    r = resolution(60.0)
    assert r.sample_interval_s == 60.0 and RESOLVED_MIN_SAMPLES == 4 and r.min_period_s == 240.0
    assert "sampled every 60 s" in r.text() and "< 240 s are not visible" in r.text()
    # Nothing archived yet: the scrape interval alone, 4 x 15 = 60 s.
    assert resolution(None).min_period_s == 60.0


@pytest.mark.django_db
def test_no_findings_beside_a_waste_figure_never_says_nothing_points_at_a_problem(client, member, job):
    client.force_login(member)
    job.waste_per_day_usd = 30.0
    job.save()
    page = client.get(f"/jobs/{job.external_id}/").content.decode()
    assert "nothing in the signals points at a problem" not in page
    assert "No finding explains this job's waste of $30.00/day" in page
    assert 'id="resolution"' in page
    # Unknown waste with a known idle lower bound is still a waste figure.
    job.waste_per_day_usd, job.waste_lower_bound_per_day_usd = None, 12.0
    job.waste_unknown_reason = "MFU unknown: no throughput"
    job.save()
    page = client.get(f"/jobs/{job.external_id}/").content.decode()
    assert "No finding explains this job" in page and "at least $12.00" in page
    # No waste: the plain statement stands.
    job.waste_per_day_usd, job.waste_lower_bound_per_day_usd = 0.0, None
    job.save()
    assert (
        "nothing in the signals points at a problem"
        in client.get(f"/jobs/{job.external_id}/").content.decode()
    )


@pytest.mark.django_db
def test_unexplained_waste_follows_the_material_threshold_setting(job, settings):
    from jobs.pipeline.findings import run_diagnosis

    # $120/day wasted (cost $400/day), no signals and no artifact: no cause can be named.
    job.cost_per_day_usd, job.waste_per_day_usd = 400.0, 120.0
    job.save()
    settings.UNEXPLAINED_WASTE_MIN_USD_PER_DAY = 50.0
    found = {f.code: f for f in run_diagnosis(job)}
    assert "unexplained_waste" in found and found["unexplained_waste"].waste_per_day_usd == 120.0
    settings.UNEXPLAINED_WASTE_MIN_USD_PER_DAY = 500.0  # $120 is below it: not material
    assert "unexplained_waste" not in {f.code for f in run_diagnosis(job)}
