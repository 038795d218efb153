"""The poll cycle's per-job work at the 5-minute cadence, spread over the cycles (issue #14): energy over a
job's whole window (one instant query per job) and the per-GPU rows (the heatmap's). A job's first poll
reads both; then each job once per POLL_PER_GPU_STEP_S in the minute its id picks (a fifth of the jobs per
cycle), instead of every job in one cycle out of five."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs.metrics import cycle_groups, ingest
from jobs.models import Job
from jobs.pipeline import poll as pipeline
from tests.prom_server import prometheus_binary
from tests.test_cycle_throughput import START, Recording, _register, local_cache, prom, sims  # noqa: F401

SLOTS = ingest.POLL_PER_GPU_STEP_S // ingest.POLL_CYCLE_S  # 300 s / 60 s: five one-minute cycles


class Instants(Recording):
    """Also keeps the instant queries apart (the energy total is one; the cycle reads the energy counter's
    rate for the charts in its range queries too)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.instants: list[str] = []

    def instant(self, query, at=None):  # type: ignore[no-untyped-def]
        self.instants.append(query)
        return super().instant(query, at)


def _job(pk: int, polled: bool = True) -> Job:
    return Job(pk=pk, data_until=START if polled else None)


def test_every_job_reads_its_energy_once_in_any_five_consecutive_cycles():
    assert SLOTS == 5
    jobs = [_job(pk) for pk in range(1, 24)]
    minute0 = datetime(2026, 11, 23, 10, 7, 13, tzinfo=UTC)  # any second inside a minute
    for first in range(SLOTS):  # whichever cycle one starts counting from
        reads = {j.pk: 0 for j in jobs}
        for m in range(first, first + SLOTS):
            due = [j.pk for j in jobs if ingest.energy_due(j, minute0 + timedelta(minutes=m))]
            # 23 jobs over 5 slots: 4 or 5 per cycle, never all of them at once.
            assert len(due) in (4, 5)
            for pk in due:
                reads[pk] += 1
        assert set(reads.values()) == {1}


def test_a_jobs_first_poll_always_reads_its_energy():
    now = datetime(2026, 11, 23, 10, 7, tzinfo=UTC)
    assert all(ingest.energy_due(_job(pk, polled=False), now) for pk in range(1, 11))


@pytest.mark.prometheus
@pytest.mark.django_db
def test_a_cycle_sends_only_the_due_jobs_energy_queries_and_keeps_the_others_value(
    prom,  # noqa: F811
    sims,  # noqa: F811
    make_team,
    settings,
    local_cache,  # noqa: F811
):
    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed")
    settings.PROMETHEUS_SCRAPE_INTERVAL_S = 30.0
    settings.PROMETHEUS_INGESTION_LAG_S = 60.0
    jobs = _register(sims, make_team("llm"))
    client = Instants(prom.url)

    def energy_queries() -> int:
        return len([q for q in client.instants if "TOTAL_ENERGY" in q])

    pipeline.poll_cycle(client, now=START + timedelta(minutes=40))
    assert energy_queries() == len(jobs)  # every job's first poll reads its energy
    first = {key: Job.objects.get(pk=j.pk).energy_j for key, j in jobs.items()}
    labelled = {key for key, j in jobs.items() if j.selector}
    assert all(first[key] is not None and first[key] > 0 for key in labelled)
    pks = {j.pk for j in jobs.values()}
    last = dict(first)
    for m in range(41, 41 + SLOTS):
        client.instants.clear()
        now = START + timedelta(minutes=m)
        due = {pk for pk in pks if (m + int(START.timestamp()) // 60) % SLOTS == pk % SLOTS}
        pipeline.poll_cycle(client, now=now)
        assert energy_queries() == len(due), m
        for key, j in jobs.items():
            value = Job.objects.get(pk=j.pk).energy_j
            if j.pk not in due:  # kept from the last read, not cleared to unknown
                assert value == last[key], (m, key)
            elif key in labelled:  # read again: the counter only grows
                assert value is not None and value >= last[key], (m, key)
            last[key] = value


@pytest.mark.prometheus
@pytest.mark.django_db
def test_a_cycle_reads_per_gpu_rows_only_for_the_jobs_whose_turn_it_is(
    prom,  # noqa: F811
    sims,  # noqa: F811
    make_team,
    settings,
    local_cache,  # noqa: F811
    monkeypatch,
):
    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed")
    settings.PROMETHEUS_SCRAPE_INTERVAL_S = 30.0
    settings.PROMETHEUS_INGESTION_LAG_S = 60.0
    jobs = _register(sims, make_team("llm"))
    by_pk = {j.pk: j for j in jobs.values()}
    asked: list[tuple[set[int], str]] = []
    request = cycle_groups.per_gpu_request

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        found = request(*args, **kwargs)
        if found is not None:
            asked.append(({t.key for t, _ in found[0]}, found[2]))
        return found

    monkeypatch.setattr(cycle_groups, "per_gpu_request", spy)
    client = Instants(prom.url)
    pipeline.poll_cycle(client, now=START + timedelta(minutes=40))
    assert set().union(*(keys for keys, _ in asked)) == set(by_pk)  # first polls: every job
    reads = dict.fromkeys(by_pk, 0)
    for m in range(41, 41 + SLOTS):
        asked.clear()
        pipeline.poll_cycle(client, now=START + timedelta(minutes=m))
        due = {pk for pk in by_pk if (m + int(START.timestamp()) // 60) % SLOTS == pk % SLOTS}
        read = set().union(*(keys for keys, _ in asked)) if asked else set()
        assert read == due, m
        for pk in read:
            reads[pk] += 1
        for keys, query in asked:  # each query selects only the due jobs of its group
            for pk, job in by_pk.items():
                if job.selector:
                    value = job.selector["hpc_job"]
                    escaped = value.replace(".", "\\\\.")  # how a regex alternative spells it in PromQL
                    named = f'"{value}"' in query or escaped in query
                    assert named == (pk in keys), (m, pk, query)
    assert set(reads.values()) == {1}
    for job in jobs.values():  # the heatmap's rows are there for every job
        job.refresh_from_db()
        from jobs.metrics import archive

        per_gpu = archive.load_per_gpu(job, "gpu_util")
        assert per_gpu is not None and per_gpu.per_gpu is not None and per_gpu.per_gpu.shape[0] == 2
