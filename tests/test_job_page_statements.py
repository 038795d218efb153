"""What the job page says when no rule fires, and what it says about the signals' resolution."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import Job
from jobs.views.job import DCGM_COLLECT_INTERVAL_S, SAMPLES_TO_RESOLVE, resolution


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


def test_resolution_names_the_scrape_the_archive_and_the_shortest_resolved_pattern(settings):
    settings.PROMETHEUS_SCRAPE_INTERVAL_S = 15
    # The coarsest of scrape (15 s), archive step (60 s) and DCGM's 30 s collect: 60 s x 4 samples = 240 s.
    r = resolution(60.0)
    assert r.resolves_s == 240.0 and SAMPLES_TO_RESOLVE == 4
    assert "scraped every 15 s, archived at 60 s" in r.text and "about 240 s" in r.text
    # Nothing archived yet: the DCGM collect interval (30 s) is the coarsest: 4 x 30 = 120 s.
    assert resolution(None).resolves_s == SAMPLES_TO_RESOLVE * DCGM_COLLECT_INTERVAL_S == 120.0


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
