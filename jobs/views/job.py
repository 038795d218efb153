"""The job page, its figures endpoint (live refresh, zoom detail), artifact upload and baseline promotion:
the views. What they show is built in `job_summary` (KPIs, definitions, readiness), `job_findings` (the
findings list and bands) and `job_figures` (time series, heatmap, their caches); `page_json` serialises it."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.messages import get_messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.middleware.csrf import get_token
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.templatetags.static import static
from django.urls import reverse
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_GET, require_POST

from jobs.access.permissions import can_write_team, is_staff, readable_job_or_404
from jobs.diagnosis.regimes import Resolution
from jobs.evaluation import baselines
from jobs.evaluation.load import reference_mfu
from jobs.evaluation.schema import Evaluation
from jobs.intake.artifacts import UploadError, requeue, store_upload
from jobs.intake.uploads import UploadRefusal, authorise_upload, install_upload_limit, upload_refused
from jobs.models import Artifact, Job
from jobs.outputs.roofline import job_roofline_data
from jobs.templatetags.compare_links import as_run, compare_runs
from jobs.views import artifacts as artifact_views
from jobs.views import job_page_cache
from jobs.views.job_figures import (
    BadParameter,
    accepts_gzip,
    build_figures,
    cached_finding_layout,
    figures_answer,
    page_figures,
    points_param,
    whole_job_response,
    zoom_window,
)
from jobs.views.job_findings import finding_views, findings_and_remainder, job_span_s
from jobs.views.job_fragments import roofline_section
from jobs.views.job_summary import (
    definitions,
    evaluation_details,
    kpis,
    signal_readiness,
    utilisation_verdict,
    with_coverage,
)
from jobs.views.page_body import Body, fill, hole, split
from jobs.views.page_json import dumps, figure_stamp, json_response, page_json, roofline_update

logger = logging.getLogger(__name__)

REFRESH_S = 60


def _job_or_404(request: HttpRequest, external_id: str) -> Job:
    """The job when the user may read it (jobs.access.permissions' read policy); 404 for another team's
    job."""
    return readable_job_or_404(
        request.user, Job.objects.select_related("team", "gpu_model"), external_id=external_id
    )


def _stamped_job_or_404(request: HttpRequest, external_id: str) -> Job:
    """`_job_or_404` with only the columns a view from a kept body uses (VIEW_FIELDS) and the content stamp
    (jobs.views.job_page_cache), read and scope-checked in one statement."""
    qs = Job.objects.only(*VIEW_FIELDS).annotate(page_stamp=job_page_cache.content_stamp())
    return readable_job_or_404(request.user, qs, external_id=external_id)


def _full_job(seen: Job) -> Job:
    """The whole job (with team and GPU model) after `_stamped_job_or_404` read and scope-checked it."""
    return Job.objects.select_related("team", "gpu_model").get(pk=seen.pk)


@require_GET
def job_detail(request: HttpRequest, external_id: str) -> HttpResponse:
    """The job page: KPIs with definitions, correlated time series with finding windows, per-GPU heatmap,
    findings ranked by $/day, artifacts and their analyses, baseline comparison, readiness.

    The body is rendered once per version of what it shows and per viewer's rights, then answered from this
    process's memory with the request's CSRF token and compare links filled in (jobs.views.job_page_cache):
    a warm view reads the session, the user, the job with its content stamp and the viewer's teams."""
    # Only the columns a view from a kept body uses: the full job (~90 columns with its team and GPU model)
    # costs more to compile and build than the rest of such a view; a body to render reads it again.
    job = _stamped_job_or_404(request, external_id)
    can_write = can_write_team(request.user, job.team_id)
    staff = is_staff(request.user)
    key = job_page_cache.body_key(job, can_write, staff)
    pending = get_messages(request)
    # Messages are placed inside the body (beside the form that caused them): such a view is not kept. A job
    # never polled nor ended spans up to now (job_span_s), which no stamp follows: not kept either.
    keep = not len(pending) and (job.ended_at is not None or job.data_until is not None)
    body = job_page_cache.bodies().get(key) if keep else None
    if body is None:
        body = render_body(_full_job(job), can_write=can_write, staff=staff, messages=list(pending))
        if keep:
            job_page_cache.bodies().put(key, body)
    compare = render_to_string(
        "jobs/_job_compare.html",
        {"job": job, "compare_runs": compare_runs(job, request.user, body.extra["baseline_runs"])},
    )
    holes = {"csrf": get_token(request).encode(), "compare": compare.encode()}
    page = render_to_string("jobs/job_detail.html", {"job": job, "body": mark_safe(BODY_HOLE)}, request)
    before, after = page.split(BODY_HOLE)
    response = HttpResponse(before.encode() + fill(body, holes) + after.encode())
    # The browser starts fetching the page's scripts when the response's headers arrive, before its renderer
    # has parsed the <head> (on a busy 2-core machine that was 100-150 ms later: benchmarks/cold_load.py).
    response["Link"] = preload_links(["vendor/plotly.min.js", "js/job.js"])
    return response


#: The Job fields a view answered from a kept body reads: the page's title (jobs/job_detail.html), the
#: compare links (jobs.templatetags.compare_links), the team for the write check, whether to keep the body.
VIEW_FIELDS = ("id", "external_id", "name", "team", "started_at", "ended_at", "data_until",
               "config_fingerprint", "model_name")  # fmt: skip

#: Where the page (base.html around the job's title and scripts) takes the body.
BODY_HOLE = hole("body")


def render_body(job: Job, *, can_write: bool, staff: bool, messages: list[Any]) -> Body:
    """The job page's body (templates/jobs/_job_body.html) for a viewer with these rights, split at its
    holes: `csrf` (every form's token) and `compare` (the per-viewer compare links). `extra` keeps the
    baseline's runs, which the compare links of every later view of this body offer. Nothing of the
    request goes in; `messages` are shown beside their forms (only on views that are not kept)."""
    findings = list(job.findings.all())  # Finding.Meta.ordering: most $/day first
    artifacts = [artifact_views.present(a) for a in job.artifacts.select_related("uploaded_by")]
    figures, figure_members = page_figures(
        job,
        findings,
        captures=artifact_views.capture_marks(v.artifact for v in artifacts),
        artifacts=[(v.artifact.pk, v.artifact.status) for v in artifacts],
    )
    comparison = baselines.compare(job)
    span_s = job_span_s(job)
    marks, bands = cached_finding_layout(job, findings, span_s)
    roofline = job_roofline_data(job)  # cached until the job changes: no query on a warm page
    # The page's JSON (element job-data) also carries "timeseries" and "heatmap": see page_json.
    page_data = {
        "artifacts": artifact_views.figures_of(artifacts),
        "refresh_url": reverse("job-figures", args=[job.external_id]),
        "finding_bands": bands,
        "running": job.status == Job.Status.RUNNING,
        "refresh_s": REFRESH_S,
        "roofline": roofline["figure"],
        "roofline_stamp": figure_stamp(roofline["figure"]),
        "pending_artifacts": [
            v.artifact.pk
            for v in artifacts
            if v.artifact.status in (Artifact.Status.QUEUED, Artifact.Status.PARSING)
        ],
    }
    mfu_row = next((r for r in comparison.rows if r.metric.key == "mfu"), None) if comparison else None
    context = {
        "job": job,
        "details": evaluation_details(job),
        "defs": definitions(job),
        "kpis": kpis(job),
        "verdict": utilisation_verdict(job),
        "trio": [
            (key, label, value, with_coverage(job, key, definition))
            for key, label, value, definition in (
                ("gpu_util", "nvidia-smi util", job.gpu_util_mean, "share of time any kernel was running"),
                (
                    "sm_active",
                    "SM active",
                    job.sm_active_mean,
                    "share of cycles an SM had work (DCGM SM_ACTIVE)",
                ),
                (
                    "tensor_active",
                    "Tensor active",
                    job.tensor_active_mean,
                    "share of cycles the tensor cores were busy (DCGM PIPE_TENSOR_ACTIVE)",
                ),
            )
        ],
        "target_mfu": reference_mfu(job),
        # The alert block names an incident's finding from these rather than joining the findings again.
        "findings_by_id": {f.pk: f for f in findings},
        **findings_and_remainder(finding_views(findings, span_s, marks, wholes=[b["whole"] for b in bands])),
        "artifacts": artifacts,
        "kinds": Artifact.Kind.choices,
        "figures": figures,
        "page_data": page_data,
        "page_json": page_json(page_data, figure_members, "job-data"),
        "comparison": comparison,
        "mfu_vs_baseline": mfu_row,
        "in_baseline": comparison is not None and job.pk in comparison.run_ids,
        # Runs promoted into the baseline despite hardware/health findings (one query, only with a baseline).
        "baseline_overrides": (
            list(comparison.baseline.overrides.select_related("user", "job")) if comparison else []
        ),
        "can_write": can_write,
        "viewer_is_staff": staff,
        "can_promote": bool(job.config_fingerprint) and job.ended_at is not None,
        "promote_blockers": baselines.health_blockers(findings) if can_write else [],
        "readiness": signal_readiness(job),
        "resolution": resolution(figures["archive_step_s"], job.evaluated),
        "max_upload_mib": settings.ARTIFACT_MAX_BYTES // 2**20,
        "grafana_url": grafana_link(job),
        # The same HTML for every viewer until the roofline's data changes: rendered once (job_fragments).
        "roofline_section": roofline_section(roofline),
        "messages": messages,
        "csrf_token": mark_safe(hole("csrf")),
        "compare_hole": mark_safe(hole("compare")),
    }
    runs = [as_run(r) for r in comparison.baseline.runs.all()] if comparison else None
    html = render_to_string("jobs/_job_body.html", context)
    return split(html, ("csrf", "compare"), extra={"baseline_runs": runs})


def preload_links(scripts: Sequence[str]) -> str:
    """A `Link` header value preloading these static scripts (their hashed URLs, as the page's tags name
    them, so the preloaded responses are the ones the tags use)."""
    return ", ".join(f"<{static(path)}>; rel=preload; as=script" for path in scripts)


GRAFANA_DASHBOARD_PATH = "/d/efficiency/efficiency"  # uid of efficiency/deploy/grafana-dashboard.json


def grafana_link(job: Job) -> str:
    """The job on the shipped Grafana dashboard over its window, when GRAFANA_URL is set ('' otherwise)."""
    base = settings.GRAFANA_URL
    if not base:
        return ""
    end = str(round(job.ended_at.timestamp() * 1000)) if job.ended_at else "now"
    query = urlencode(
        {"var-job_id": job.external_id, "from": round(job.started_at.timestamp() * 1000), "to": end}
    )
    return f"{base.rstrip('/')}{GRAFANA_DASHBOARD_PATH}?{query}"


def resolution(archive_step_s: float | None, evaluated: Evaluation | None = None) -> Resolution:
    """The signals' effective resolution as the diagnosis uses it (jobs.diagnosis.regimes): the coarser of
    the scrape interval (setting) and the archive's step; when GPU utilisation came from an uploaded
    nvidia-smi log (the evaluation's signal_intervals_s), that log's sampling interval."""
    log_interval = evaluated.signal_intervals_s.get("gpu_util") if evaluated is not None else None
    if log_interval:
        return Resolution(float(log_interval), None)
    scrape = float(settings.PROMETHEUS_SCRAPE_INTERVAL_S)
    return Resolution(max(scrape, archive_step_s or 0.0), None)


@require_GET
def job_figures(request: HttpRequest, external_id: str) -> HttpResponse:
    """Figures as JSON for the page's script: `?points=` (pixel budget), `?start=&end=` (Unix s) for the
    detail of a zoomed window, `?only=status` for just status, KPIs and artifact states. Polled every
    minute while the job runs.

    The whole-job answer is kept in this process's memory like the page's body (jobs.views.job_page_cache),
    per content stamp, pixel budget, roofline the page drew and encoding: nothing in it is the viewer's, and
    the stamp covers every row it is drawn from (job, artifacts, findings); a view that finds it reads the
    session, the user and the job's view columns with the stamp, nothing else."""
    params = request.GET
    whole = params.get("only") != "status" and not params.get("start") and not params.get("end")
    known = request.GET.get("roofline", "")
    key = None
    # Only a roofline stamp as the page sends it is a key (16 hex digits): other values answer the same.
    if whole and (not known or re.fullmatch(r"[0-9a-f]{16}", known)):
        seen = _stamped_job_or_404(request, external_id)
        key = ("figures", job_page_cache.stamp_of(seen), points_param(request), known, accepts_gzip(request))
        kept = job_page_cache.bodies().get(key)
        if kept is not None:
            return figures_answer(fill(kept, {}), gzipped=key[4])
        job = _full_job(seen)  # read and scope-checked above: not a second permission query
    else:
        job = _job_or_404(request, external_id)
    statuses = list(job.artifacts.values_list("id", "status"))
    body: dict[str, Any] = {
        "status": job.status,
        "running": job.status == Job.Status.RUNNING,
        "data_until": job.data_until.isoformat() if job.data_until else None,
        "kpis": kpis(job),
        "verdict": utilisation_verdict(job),
        "ratios": {
            "gpu_util": job.gpu_util_mean,
            "sm_active": job.sm_active_mean,
            "tensor_active": job.tensor_active_mean,
        },
        "artifacts": [{"id": pk, "status": status} for pk, status in statuses],
    }
    # The roofline only when it changed since the figure the page drew (`?roofline=` its stamp): #25.
    roofline = roofline_update(job_roofline_data(job)["figure"], request.GET.get("roofline", ""))
    if roofline is not None:
        body["roofline"] = roofline
    if request.GET.get("only") != "status":
        try:
            window = zoom_window(request)
        except BadParameter as exc:
            return json_response({"detail": str(exc)}, status=400)
        if window is None:  # the whole job: spliced in from the cache, already serialised (and gzipped)
            response = whole_job_response(request, job, dumps(body), points_param(request), statuses)
            if key is not None:
                job_page_cache.bodies().put(key, Body((response.content,)))
            return response
        figures = build_figures(
            job,
            list(job.findings.all()),
            points=points_param(request),
            window=window,
            captures=artifact_views.capture_marks(job.artifacts.all()),
        )
        body |= {"timeseries": figures["timeseries"], "heatmap": figures["heatmap"], "window": window}
    return json_response(body)


@require_POST
def job_artifact_upload(request: HttpRequest, external_id: str) -> HttpResponse:
    """Store an uploaded profiling file for the job and queue its analysis (team members and staff)."""
    # Login and team from the session before the body is read (RequestLimitsMiddleware did the same ahead
    # of the CSRF check; this holds when the view is reached another way), then the streaming size limit.
    try:
        _, job = authorise_upload(request, external_id, api=False)
    except UploadRefusal as refusal:
        if refusal.status == 404:
            raise Http404(refusal.message) from None
        if refusal.status in (401, 403):
            raise PermissionDenied(refusal.message) from None
        return HttpResponse(refusal.message, status=refusal.status, content_type="text/plain")
    install_upload_limit(request)
    target = reverse("job-detail", args=[job.external_id]) + "#artifacts"
    upload = request.FILES.get("file")
    if refused := upload_refused(request):
        messages.error(request, f"Upload refused: {refused}.", extra_tags="at-artifacts")
        return HttpResponseRedirect(target)
    kind = request.POST.get("kind") or None
    rank_text = (request.POST.get("rank") or "").strip()
    if upload is None:
        messages.error(request, "Choose a file to upload.", extra_tags="at-artifacts")
        return HttpResponseRedirect(target)
    if kind is not None and kind not in Artifact.Kind.values:
        messages.error(request, f"Unknown artifact kind {kind!r}.", extra_tags="at-artifacts")
        return HttpResponseRedirect(target)
    if rank_text and not (rank_text.isascii() and rank_text.isdigit() and int(rank_text) < 2**31):
        messages.error(
            request, "Rank must be a whole number from 0 to 2147483647, or empty.", extra_tags="at-artifacts"
        )
        return HttpResponseRedirect(target)
    try:
        artifact = store_upload(
            job,
            upload,
            kind=kind,
            rank=int(rank_text) if rank_text else None,
            user=request.user,
            time_zone=(request.POST.get("timezone") or "").strip() or None,
        )
    except UploadError as exc:
        messages.error(request, f"Upload of {upload.name} refused: {exc}", extra_tags="at-artifacts")
        return HttpResponseRedirect(target)
    messages.success(
        request,
        f"Uploaded {artifact.original_name} ({artifact.get_kind_display()}); "
        f"analysis {artifact.get_status_display().lower()}.",
        extra_tags="at-artifacts",
    )
    return HttpResponseRedirect(target)


@require_POST
def job_artifact_reparse(request: HttpRequest, external_id: str, artifact_id: int) -> HttpResponse:
    """Parse one of the job's artifacts again (team members and staff)."""
    job = _job_or_404(request, external_id)
    if not can_write_team(request.user, job.team):
        raise PermissionDenied("Only members of the job's team can re-parse its artifacts.")
    artifact = requeue(get_object_or_404(Artifact, pk=artifact_id, job=job))
    messages.success(
        request, f"{artifact.original_name} queued for parsing again.", extra_tags="at-artifacts"
    )
    return HttpResponseRedirect(reverse("job-detail", args=[job.external_id]) + "#artifacts")


@require_POST
def job_promote_baseline(request: HttpRequest, external_id: str) -> HttpResponse:
    """Add this finished job to its team's baseline of its config (jobs.evaluation.baselines.promote holds
    every rule: team members and staff; a run with warning-or-worse hardware/health findings only with
    "promote anyway" ticked and a reason, which is recorded)."""
    job = _job_or_404(request, external_id)
    target = reverse("job-detail", args=[job.external_id]) + "#baseline"
    anyway = request.POST.get("promote_anyway") == "1"
    reason = (request.POST.get("reason") or "") if anyway else ""
    try:
        promotion = baselines.promote(job, request.user, override_reason=reason)
    except baselines.PromotionForbidden:
        raise PermissionDenied("Only members of the job's team can promote it to a baseline.") from None
    except baselines.UnhealthyRun as exc:
        names = ", ".join(f"{f.title} ({f.get_severity_display().lower()})" for f in exc.blockers)
        messages.error(
            request,
            f"Not promoted: this run has hardware or health findings ({names}), so it is not a healthy "
            'reference. Tick "promote anyway" and give a reason to promote it regardless.',
            extra_tags="at-baseline",
        )
    except baselines.BaselineError as exc:
        messages.error(request, f"Not promoted: {exc}.", extra_tags="at-baseline")
    else:
        baseline, override = promotion.baseline, promotion.override
        messages.success(
            request,
            f"Added to the {baseline.model_name} baseline [{baseline.fingerprint[:8]}], now "
            f"{promotion.runs} run(s). Waste of this team's jobs with this config is measured against its "
            "median MFU from their next update."
            + (
                f" Promoted despite {', '.join(override.finding_codes)}: {override.reason}"
                if override is not None
                else ""
            ),
            extra_tags="at-baseline",
        )
    return HttpResponseRedirect(target)
