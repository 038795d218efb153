"""The job page's rendered body, kept per version of everything it shows and per viewer's rights (#26 item
4: a 256-GPU x 7-day page cost ~20-30 ms of CPU a view, most of it queries' Python, context and templates,
for HTML that changes once a poll).

The version is `content_stamp`: one md5 that Postgres computes in the statement that reads the job (and checks
that the viewer may read it), over the full rows of everything the body is drawn from: the job, its team and
GPU model, its findings, its artifacts (with the names of the users who uploaded, confirmed or excluded
them), its alert incidents (with their findings' code and title), and its team's active baseline for its
config (the baseline row, its runs' link fields, its promotion overrides with their user and job). Whatever
writes one of those rows (a save, a `QuerySet.update()`, raw SQL, another process) changes the stamp, so no
invalidation can be forgotten. Content-addressed like the cached figures and fragments, it is a superset of
their keys (jobs.views.job_figures: job columns, findings, artifacts).

The key adds what decides which parts a viewer sees: whether they may write to the job's team (upload,
review, promote forms) and whether they are staff (the GPU catalog link). Whether they may read the job at
all is decided before any lookup, by the same statement (jobs.access.permissions.readable_job_or_404): a
body is only ever answered to a viewer who may read the job, with the parts their rights allow. What differs
per request is not in the body but filled into its holes (jobs.views.page_body): the CSRF token and the
compare links (per viewer: they name only runs the viewer may read). A request with messages to show (after
an upload or a promotion) is rendered whole and not kept.

Settings the page prints (GRAFANA_URL, ARTIFACT_MAX_BYTES, the scrape interval, ...) and its templates do not
change while a process runs; a test that overrides a setting, and the development server's reload of a changed
file, clear the bodies (`setting_changed`, `file_changed`)."""

from __future__ import annotations

import functools
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Model
from django.db.models.expressions import RawSQL
from django.dispatch import receiver
from django.test.signals import setting_changed
from django.utils.autoreload import file_changed

from jobs.models import AlertIncident, Artifact, Baseline, Finding, GpuModel, Job, PromotionOverride, Team
from jobs.views.job_figures import FIGURES_CACHE_S
from jobs.views.page_body import BodyCache

#: A body is rendered again after this long even when no row it shows changed: the figures and roofline it
#: holds come from caches of the same age (jobs.views.job_figures.FIGURES_CACHE_S) whose keys name the job's
#: columns, not every archive row (retention can thin a finalized job's per-GPU rows without touching it).
MAX_AGE_S = FIGURES_CACHE_S

_bodies: BodyCache | None = None


def bodies() -> BodyCache:
    """This process's job page bodies (`JOB_PAGE_CACHE_MIB` of them; 0 keeps none)."""
    global _bodies
    if _bodies is None:
        _bodies = BodyCache(int(settings.JOB_PAGE_CACHE_MIB) * 2**20, max_age_s=MAX_AGE_S)
    return _bodies


@receiver(setting_changed)
@receiver(file_changed)
def _forget_bodies(**_: Any) -> None:
    # A body printed the settings it was rendered with, and its templates: in a running service neither
    # changes, but a test overrides settings and the development server reloads templates in place
    # (django.template.autoreload) without a new process. Returns None: the reload goes on as before.
    global _bodies
    _bodies = None


#: What `content_stamp` hashes, one md5 per part; {job} is the outer query's job row. Column names are the
#: models' (Django's defaults); tests/test_job_page_body.py changes each part and sees the stamp change.
_STAMP_PARTS = (
    "md5({job}::text)",
    "(SELECT md5(t::text) FROM {team} t WHERE t.id = {job}.team_id)",
    "(SELECT md5(g::text) FROM {gpu} g WHERE g.id = {job}.gpu_model_id)",
    "(SELECT md5(string_agg(md5(f::text), ',' ORDER BY f.id)) FROM {finding} f WHERE f.job_id = {job}.id)",
    # Artifacts with the users the page names (uploaded, confirmed, excluded by).
    """(SELECT md5(string_agg(md5(ROW(a.*, u.username, c.username, x.username)::text), ',' ORDER BY a.id))
        FROM {artifact} a LEFT JOIN {user} u ON u.id = a.uploaded_by_id
        LEFT JOIN {user} c ON c.id = a.confirmed_by_id LEFT JOIN {user} x ON x.id = a.excluded_by_id
        WHERE a.job_id = {job}.id)""",
    # Alert incidents with the finding the block names (jobs.templatetags.alerts.job_alerts).
    """(SELECT md5(string_agg(md5(ROW(i.*, f.code, f.title)::text), ',' ORDER BY i.id))
        FROM {incident} i LEFT JOIN {finding} f ON f.id = i.finding_id WHERE i.job_id = {job}.id)""",
    # The team's active baseline for the job's config (jobs.evaluation.baselines.active_baseline) with its
    # runs' link fields (compare links, run count) and its promotion overrides (user, job named).
    """(SELECT md5(string_agg(ROW(b.*,
            (SELECT string_agg(ROW(r.id, r.external_id, r.name, r.team_id, r.started_at)::text, ','
                ORDER BY r.id) FROM {runs} br JOIN {job} r ON r.id = br.job_id WHERE br.baseline_id = b.id),
            (SELECT string_agg(ROW(o.*, ou.username, oj.external_id, oj.name)::text, ',' ORDER BY o.id)
                FROM {override} o LEFT JOIN {user} ou ON ou.id = o.user_id
                LEFT JOIN {job} oj ON oj.id = o.job_id WHERE o.baseline_id = b.id))::text, ',' ORDER BY b.id))
        FROM {baseline} b WHERE b.team_id = {job}.team_id AND b.fingerprint = {job}.config_fingerprint
        AND {job}.config_fingerprint <> '' AND b.retired_at IS NULL)""",
)


def content_stamp() -> RawSQL:
    """An annotation for a Job queryset: the md5 of every row the job page's body is drawn from (see the
    module's docstring). Rows are hashed as Postgres prints them; ROW(...)::text, unlike concat_ws, tells a
    NULL from an empty string and keeps each part in its place."""
    return RawSQL(_stamp_sql(), ())


@functools.cache
def _stamp_sql() -> str:
    """The stamp's SQL, built once per process: it depends only on the models' tables (every page view and
    every minute's figures poll asks for it)."""
    tables: dict[str, type[Model]] = {
        "job": Job, "team": Team, "gpu": GpuModel, "finding": Finding, "artifact": Artifact,
        "incident": AlertIncident, "baseline": Baseline, "runs": Baseline.runs.through,
        "override": PromotionOverride, "user": get_user_model(),
    }  # fmt: skip
    names = {k: connection.ops.quote_name(m._meta.db_table) for k, m in tables.items()}
    parts = ", ".join(p.format(**names) for p in _STAMP_PARTS)
    return f"md5(ROW({parts})::text)"


def stamp_of(job: Job) -> str:
    """The job's content stamp, as read with it (the queryset annotated `page_stamp=content_stamp()`)."""
    stamp = getattr(job, "page_stamp", None)
    if not stamp:
        raise ValueError("the job was read without its content stamp (annotate page_stamp=content_stamp())")
    return str(stamp)


def body_key(job: Job, can_write: bool, staff: bool) -> tuple[str, bool, bool]:
    """The body's key: its content stamp and the viewer's rights that change what it shows."""
    return (stamp_of(job), can_write, staff)
