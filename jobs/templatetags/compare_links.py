"""`compare_runs`: the runs a job page offers to compare with (previous and next run of the same config
fingerprint or model, the baseline's runs), each as before/after ids; the page fills them in per viewer
(jobs/_job_compare.html, jobs.views.job).

The neighbours are cached per (job, viewer): finding them is one UNION of four scoped queries, about a
fifth of a warm job page's CPU (issue 26 item 4, cProfile of the test client), and they change only when a
job is registered, deleted or re-described, or when a membership changes. Every such write bumps one
generation (`bump_generation`, connected to Job and Membership saves and deletes in jobs.apps); an entry
of an older generation is recomputed. Writers of the link fields through `QuerySet.update()` send no
signal: they must call `bump_generation` (none does today: ingestion's updates touch other columns)."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.urls import reverse
from django.utils.http import urlencode

from jobs.access.permissions import is_staff, readable_jobs, readable_team_ids
from jobs.models import Job

BASELINE_RUNS = 5
#: The Job fields a candidate link uses (template: name, external_id, started_at; matching: the rest).
_LINK_FIELDS = ("id", "external_id", "name", "team_id", "started_at", "config_fingerprint", "model_name")
#: A save that names only other columns (the poll's `update_fields`) cannot change any job's neighbours.
_LINK_COLUMNS = frozenset({"external_id", "name", "team", "team_id", "started_at", "config_fingerprint",
                           "model_name"})  # fmt: skip
GENERATION_KEY = "compare-links:generation"
#: An entry outlives its generation only until this (s): a safety net should a bump be lost, not the
#: invalidation itself.
CACHE_S = 3600


@dataclass(frozen=True)
class Run:
    """Another job as a compare link shows it (what `_LINK_FIELDS` reads), cacheable without the model."""

    pk: int
    external_id: str
    name: str
    team_id: int
    started_at: datetime
    config_fingerprint: str
    model_name: str


def as_run(job: Job) -> Run:
    """The link fields of `job`, without the model (cacheable)."""
    return Run(job.pk, job.external_id, job.name, job.team_id, job.started_at, job.config_fingerprint,
               job.model_name)  # fmt: skip


def _link(job: Job, other: Run | Job, label: str) -> dict[str, Any]:
    before, after = (other, job) if other.started_at <= job.started_at else (job, other)
    return {
        "label": label,
        "other": other,
        "url": reverse("job-compare") + "?" + urlencode({"a": before.external_id, "b": after.external_id}),
    }


def bump_generation(**_: Any) -> None:
    """Invalidate every cached neighbour list: now, and again once the transaction commits (a page that
    read the old rows between the two would otherwise cache them under the new generation)."""

    def bump() -> None:
        cache.set(GENERATION_KEY, uuid.uuid4().hex, None)

    bump()
    transaction.on_commit(bump)


def job_saved(update_fields: frozenset[str] | None = None, **kwargs: Any) -> None:
    """post_save receiver of Job: a save that may change what a compare link reads bumps the generation."""
    if update_fields is None or not _LINK_COLUMNS.isdisjoint(update_fields):
        bump_generation()


def _neighbours(job: Job, user: Any) -> list[Run]:
    """Previous / next run of the same config fingerprint and of the same model that `user` may read (read
    policy: another team's run is neither named nor linked); one query, the four in one UNION."""
    # Only what the links show and the matching needs: four unioned copies of every Job column cost more
    # to compile and fetch than the page's other queries together.
    others = readable_jobs(user, Job.objects.exclude(pk=job.pk)).only(*_LINK_FIELDS)
    parts = []
    for field, value in (("config_fingerprint", job.config_fingerprint), ("model_name", job.model_name)):
        if not value:
            continue
        same = others.filter(**{field: value})
        parts.append(same.filter(started_at__lte=job.started_at).order_by("-started_at")[:1])
        parts.append(same.filter(started_at__gt=job.started_at).order_by("started_at")[:1])
    return [as_run(o) for o in parts[0].union(*parts[1:], all=True)] if parts else []


def _cache_key(job: Job, user: Any) -> str:
    # Per viewer, with what decides what they may read (staff, READ_SCOPE), and the job's own link fields.
    parts = (job.pk, job.config_fingerprint, job.model_name, job.started_at.isoformat(),
             getattr(user, "pk", None), is_staff(user), settings.READ_SCOPE)  # fmt: skip
    return "compare-links:" + hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def cached_neighbours(job: Job, user: Any, with_readable: bool) -> tuple[list[Run], set[int] | None]:
    """`_neighbours` and, when `with_readable`, the teams `user` may read (`readable_team_ids`), from the
    cache while no job or membership changed since they were read (one cache round trip, no query)."""
    key = _cache_key(job, user)
    found = cache.get_many([GENERATION_KEY, key])
    generation = found.get(GENERATION_KEY)
    if generation is None:  # never bumped, or evicted: start one, so entries written from now on are valid
        generation = uuid.uuid4().hex
        if not cache.add(GENERATION_KEY, generation, None):
            generation = cache.get(GENERATION_KEY) or generation
    entry = found.get(key)
    if entry is not None and entry["generation"] == generation and (not with_readable or "readable" in entry):
        return list(entry["runs"]), entry.get("readable")
    entry = {"generation": generation, "runs": _neighbours(job, user)}
    if with_readable:
        entry["readable"] = readable_team_ids(user)
    cache.set(key, entry, CACHE_S)
    return list(entry["runs"]), entry.get("readable")


def compare_runs(job: Job, user: Any, baseline_runs: Iterable[Run | Job] | None) -> list[dict[str, Any]]:
    """Previous / next run with the same config fingerprint, else of the same model, and the baseline's runs,
    for `user` (only runs the viewer may read; earlier run first, A = before), with the baseline's runs as
    given (None: the job has no baseline):
    the job page's view passes them from its cached body (`as_run` of each), so it reads no baseline."""
    with_baseline = baseline_runs is not None  # the readable teams are read only to filter baseline runs
    neighbours, readable = cached_neighbours(job, user, with_readable=with_baseline)
    out: list[dict[str, Any]] = []
    seen = {job.pk}
    for field, value, what in (
        ("config_fingerprint", job.config_fingerprint, "with this config"),
        ("model_name", job.model_name, f"of {job.model_name}"),
    ):
        if not value:
            continue
        same_runs = [o for o in neighbours if getattr(o, field) == value]
        earlier = max((o for o in same_runs if o.started_at <= job.started_at), key=lambda o: o.started_at,
                      default=None)  # fmt: skip
        later = min((o for o in same_runs if o.started_at > job.started_at), key=lambda o: o.started_at,
                    default=None)  # fmt: skip
        for other, when in ((earlier, "previous run"), (later, "next run")):
            if other is not None and other.pk not in seen:
                seen.add(other.pk)
                out.append(_link(job, other, f"{when} {what}"))
    if baseline_runs is not None:
        runs = [r for r in baseline_runs if r.pk not in seen and (readable is None or r.team_id in readable)]
        for run in sorted(runs, key=lambda r: r.started_at, reverse=True)[:BASELINE_RUNS]:
            seen.add(run.pk)
            out.append(_link(job, run, "baseline run"))
    return out
