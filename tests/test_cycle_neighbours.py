"""The poll cycle's sharing index (`sharing.Neighbours`) answers the sharing look-up (`sharing.look_up`)
as the per-job queries do, looking only at the jobs that hold one of the job's GPUs (`others_sharing`),
with and without the MAX_OTHERS cut in play."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs.evaluation import sharing
from jobs.models import Job

START = datetime(2026, 1, 1, tzinfo=UTC)
NOW = START + timedelta(hours=4)


def _job(team, name: str, gpus: list[tuple[str, int]], start_h: float, end_h: float | None, seen_h: float):
    return Job.objects.create(
        team=team, external_id=name, gpu_count=len(gpus), started_at=START + timedelta(hours=start_h),
        ended_at=START + timedelta(hours=end_h) if end_h is not None else None,
        data_until=START + timedelta(hours=seen_h), gpus=[{"hostname": h, "gpu": g} for h, g in gpus],
    )  # fmt: skip


@pytest.fixture
def jobs(db, make_team, settings):
    # Declared time-sliced by the platform: only then do overlapping claims share a GPU
    # (jobs.access.ownership).
    settings.TIME_SLICED_GPUS = ["n1/*", "n2/*"]
    team = make_team("llm")
    return [
        _job(team, "a", [("n1", 0), ("n1", 1)], 0, None, 3.9),
        _job(team, "b", [("n1", 1)], 1, 2, 2),  # shares n1/1 with a for an hour
        _job(team, "c", [("n1", 0)], 0.5, None, 3.9),  # time-slices n1/0 with a
        _job(team, "d", [("n2", 0)], 0, None, 3.9),  # alone
        _job(team, "e", [("n1", 0)], 3.95, None, 3.95),  # n1/0 too, seen only at its start
        _job(team, "f", [("n1", 1)], 5, None, 5),  # starts after NOW: no overlap
    ]


def _summary(report: sharing.SharingReport) -> tuple:
    return (
        sorted((s.gpu, s.other_job, s.start, s.end) for s in report.shared),
        report.share,
        sorted(report.attribution.shares.items()),
    )


@pytest.mark.parametrize("max_others", [sharing.MAX_OTHERS, 2])
def test_the_index_answers_what_the_queries_answer(jobs, monkeypatch, max_others):
    # With 2 the cut of the overlapping jobs applies (4 others overlap a), and the index scans them all.
    monkeypatch.setattr(sharing, "MAX_OTHERS", max_others)
    index = sharing.Neighbours(jobs)
    for job in jobs:
        assert index.covers(job)
        assert _summary(
            sharing.attribute_shares(job, sharing.look_up(job, None, NOW, index), NOW)
        ) == _summary(sharing.attribute_shares(job, sharing.look_up(job, None, NOW), NOW)), job.external_id
    # Not vacuous: a's overlapping jobs by start are d (0 h), c (0.5 h), b (1 h), e (3.95 h). It shares
    # n1/0 with c and n1/1 with b; e holds n1/0 but was seen only at its start (an empty window); d holds
    # n2/0. With a cut of 2 only d and c are compared: b is dropped, by the index as by the query.
    report = sharing.attribute_shares(jobs[0], sharing.look_up(jobs[0], None, NOW, index), NOW)
    expected = {"b", "c"} if max_others >= 4 else {"c"}
    assert {s.other_job for s in report.shared} == expected
    assert sharing.attribute_shares(jobs[3], sharing.look_up(jobs[3], None, NOW, index), NOW).shared == []


def test_others_sharing_lists_only_the_overlapping_jobs_on_the_same_gpus(jobs):
    index = sharing.Neighbours(jobs)
    assert [o.external_id for o in index.others_sharing(jobs[0], NOW)] == ["c", "b", "e"]  # by start
    assert [o.external_id for o in index.others(jobs[0], NOW)] == ["d", "c", "b", "e"]
    assert index.others_sharing(jobs[3], NOW) == []
