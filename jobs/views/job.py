"""The job page, its figures endpoint (live refresh, zoom detail), artifact upload and baseline promotion."""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import orjson
from django.conf import settings
from django.contrib import messages
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Max
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.templatetags.static import static
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, strip_tags
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_GET, require_POST

from jobs import charts
from jobs.artifacts import UploadError, requeue, store_upload
from jobs.diagnosis.regimes import Resolution
from jobs.downsample import MINMAX_RATIO
from jobs.evaluation import baselines
from jobs.evaluation.costs import format_usd
from jobs.evaluation.load import reference_mfu
from jobs.evaluation.schema import Evaluation, encode
from jobs.metrics.archive import load_means, load_per_gpu
from jobs.metrics.ingest import NO_GPUS_MATCHED
from jobs.metrics.sampling import coverage_note
from jobs.metrics.signals import SIGNALS, readiness
from jobs.models import Artifact, Finding, Job
from jobs.models.jobs import REMAINDER_CODE
from jobs.outputs.numbers import format_number
from jobs.outputs.roofline import job_roofline_data
from jobs.outputs.roofline import page_lines as roofline_page_lines
from jobs.permissions import can_write_team, readable_job_or_404
from jobs.profiling.safe_json import make_storable
from jobs.templatetags.units import job_cost_total, job_waste_total, money, num, pct, usd
from jobs.uploads import UploadRefusal, authorise_upload, install_upload_limit, upload_refused
from jobs.views import artifacts as artifact_views

logger = logging.getLogger(__name__)

REFRESH_S = 60
# Django's json_script escaping: the JSON cannot close the <script> element or start a comment.
_JSON_ESCAPES = (("&", "\\u0026"), ("<", "\\u003C"), (">", "\\u003E"))


def json_script(value: Any, element_id: str) -> str:
    """django.utils.html.json_script with the same escaping, serialised by orjson: a megabyte of figure
    data takes ~3 ms instead of ~30 ms."""
    text = dumps(value).decode()
    for char, escaped in _JSON_ESCAPES:
        text = text.replace(char, escaped)
    return format_html('<script id="{}" type="application/json">{}</script>', element_id, mark_safe(text))


def dumps(value: Any) -> bytes:
    """orjson, which writes NaN/Infinity as null, falling back for what it refuses (integers past 64 bits,
    as a stored py-spy sample count of 10^23): such a value becomes a float, or null past 1e308. No stored
    value can make a page fail to render."""
    try:
        return orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return orjson.dumps(make_storable(value)[0])


def _json_response(body: dict[str, Any], status: int = 200) -> HttpResponse:
    response = HttpResponse(dumps(body), content_type="application/json", status=status)
    response["Cache-Control"] = "no-store"
    return response


HEATMAP_LABELS = {"sm_active": "SM active", "gpu_util": "nvidia-smi util"}


def _job_or_404(request: HttpRequest, external_id: str) -> Job:
    """The job when the user may read it (jobs.permissions' read policy); 404 for another team's job."""
    return readable_job_or_404(
        request.user, Job.objects.select_related("team", "gpu_model"), external_id=external_id
    )


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def finding_windows(finding: Finding) -> list[tuple[float, float]]:
    """A finding's windows in Unix s: `windows`, else [window_start, window_end]; bad entries dropped."""
    out = []
    for w in finding.windows or []:
        if isinstance(w, list | tuple) and len(w) == 2:
            start, end = _finite(w[0]), _finite(w[1])
            if start is not None and end is not None and end >= start:
                out.append((start, end))
    if not out and finding.window_start and finding.window_end:
        out.append((finding.window_start.timestamp(), finding.window_end.timestamp()))
    return out


def finding_marks(findings: list[Finding]) -> list[charts.FindingMark]:
    """Findings numbered in page order, each with its colour and windows for the charts."""
    return [
        charts.FindingMark(
            f.code, i, f.title, charts.FINDING_COLOURS[(i - 1) % len(charts.FINDING_COLOURS)],
            tuple(finding_windows(f)),
        )
        for i, f in enumerate(findings, start=1)
    ]  # fmt: skip


@dataclass(frozen=True)
class FindingView:
    """A finding as listed on the job page: its number and colour on the charts, the zoom target."""

    finding: Finding
    mark: charts.FindingMark
    colour_index: int
    window_text: str
    zoom_ms: tuple[int, int] | None
    evidence: list[str]


def _evidence(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)
    value = item.get("value")
    if isinstance(value, float):
        value = format_number(value)
    unit = item.get("unit") or ""
    return f"{item.get('label', '')}: {value} {unit}".strip()


def _window_text(windows: tuple[tuple[float, float], ...]) -> str:
    if not windows:
        return "the whole job"
    first = datetime.fromtimestamp(windows[0][0], tz=UTC)
    last = datetime.fromtimestamp(windows[-1][1], tz=UTC)
    hours = sum(e - s for s, e in windows) / 3600
    count = f"{len(windows)} windows" if len(windows) > 1 else "1 window"
    return f"{count}, {hours:,.1f} h in all, {first:%Y-%m-%d %H:%M} → {last:%Y-%m-%d %H:%M} UTC"


def finding_views(
    findings: list[Finding],
    job_span_s: float,
    marks: Sequence[charts.FindingMark] | None = None,
    wholes: Sequence[bool] | None = None,
) -> list[FindingView]:
    """Findings in page order (most $/day first) with what the list and its zoom buttons need. A finding
    over (nearly) the whole job gets no zoom button: there is nothing to zoom to. `marks` (finding_marks)
    and `wholes` (that flag per finding: the bands' `whole`, the same test) when already known."""
    out = []
    if marks is None:
        marks = finding_marks(findings)
    for i, (f, mark) in enumerate(zip(findings, marks, strict=True)):
        zoom = None
        if wholes is not None:
            whole = wholes[i]
        else:
            whole = not mark.windows or charts.covers_whole_span(mark.windows, job_span_s)
        if not whole:
            zoom = (
                round(min(w[0] for w in mark.windows) * 1000),
                round(max(w[1] for w in mark.windows) * 1000),
            )
        text = "the whole job" if whole else _window_text(mark.windows)
        out.append(
            FindingView(
                f, mark, (mark.number - 1) % len(charts.FINDING_COLOURS), text, zoom,
                [_evidence(e) for e in (f.evidence or [])],
            )
        )  # fmt: skip
    return out


def _findings_and_remainder(views: list[FindingView]) -> dict[str, Any]:
    """The page's findings split as they are shown: the specific causes as the ranked list, and the
    unexplained remainder once, as a footer line under it ("$X/day not explained by the findings above")."""
    return {
        "findings": [v for v in views if v.finding.code != REMAINDER_CODE],
        "remainder": next((v for v in views if v.finding.code == REMAINDER_CODE), None),
    }


#: At most this many windows per finding travel to the page (the charts redraw them at every zoom).
MAX_PAGE_WINDOWS = 2000


def finding_bands(findings: list[Finding], job_span_s: float) -> list[dict[str, Any]]:
    """Every finding's windows (ms) for the page's script, which shades them again at each zoom's
    resolution (jobs.charts.finding_shapes merges them at the whole job's). Findings over (nearly) the
    whole job are flagged `whole` and not shaded, as on the server."""
    from jobs.charts.common import BLACK, BLUE

    out = []
    for mark in finding_marks(findings):
        windows = charts.merge_windows(mark.windows, 0.0, MAX_PAGE_WINDOWS)
        out.append({
            "code": mark.code, "number": mark.number, "colour": mark.colour,
            "font": "#ffffff" if mark.colour in (BLUE, BLACK) else "#000000",
            "whole": not windows or charts.covers_whole_span(mark.windows, job_span_s),
            "windows": [[round(a * 1000), round(b * 1000)] for a, b in windows],
        })  # fmt: skip
    return out


def _cached_finding_layout(
    job: Job, findings: list[Finding], job_span_s: float
) -> tuple[list[charts.FindingMark], list[dict[str, Any]]]:
    """`finding_marks` and `finding_bands`, cached: validating and merging thousands of finding windows
    is ~10 ms a page, and both only change with the findings (ids, last change) or the job's span (each
    poll of a running job)."""
    parts = (job.pk, [(f.pk, f.updated_at) for f in findings], job_span_s)
    key = "job-finding-layout:" + hashlib.sha256(repr(parts).encode()).hexdigest()
    layout = cache.get(key)
    if layout is None:
        layout = (finding_marks(findings), finding_bands(findings, job_span_s))
        cache.set(key, layout, FIGURES_CACHE_S)
    return list(layout[0]), list(layout[1])


def _job_span_s(job: Job) -> float:
    end = job.ended_at or job.data_until or timezone.now()
    return max(0.0, (end - job.started_at).total_seconds())


class BadParameter(ValueError):
    """A malformed query parameter of the figures endpoint (answered with a 400)."""


# Zoom windows must lie between 2000 and a day from now (datetime cannot represent 1e20 s).
_EARLIEST_UNIX = datetime(2000, 1, 1, tzinfo=UTC).timestamp()


def _window(request: HttpRequest) -> tuple[float, float] | None:
    raw_start, raw_end = request.GET.get("start"), request.GET.get("end")
    if not raw_start and not raw_end:
        return None
    start, end = _finite(raw_start), _finite(raw_end)
    latest = timezone.now().timestamp() + 86400
    if start is None or end is None:
        raise BadParameter("start and end must both be Unix times in seconds")
    if not (_EARLIEST_UNIX <= start <= latest and _EARLIEST_UNIX <= end <= latest):
        raise BadParameter(
            f"start and end must be Unix seconds between {_EARLIEST_UNIX:.0f} and {latest:.0f}"
        )
    if end <= start:
        raise BadParameter("end must be after start")
    return start, end


def _points(request: HttpRequest) -> int:
    value = _finite(request.GET.get("points"))
    return charts.clamp_points(int(value) if value else None)


def heatmap_signal(job: Job) -> str:
    """The signal the per-GPU heatmap shows: SM active, or nvidia-smi util when SM active is not collected."""
    return "gpu_util" if "sm_active" in (job.missing_signals or []) else "sm_active"


#: How long built whole-job figures stay cached: the key changes with every poll, diagnosis and finding
#: anyway; the expiry only bounds what a deleted job leaves behind.
FIGURES_CACHE_S = 600


def _figures_key(job: Job, findings: tuple[int, Any], artifacts: list[tuple[int, str]], points: int) -> str:
    """Everything the whole-job figures are built from that can change: the archive (data_until, the
    job's own save on each poll), the diagnosis and its findings (count, latest change), the artifacts
    (capture windows appear when a parse ends: ids and states)."""
    parts = (job.pk, job.updated_at, job.data_until, job.diagnosed_at, job.missing_reasons, points, findings,
             sorted(artifacts))  # fmt: skip
    return "job-figures:" + hashlib.sha256(repr(parts).encode()).hexdigest()


def _findings_stamp(findings: Sequence[Finding]) -> tuple[int, Any]:
    return len(findings), max((f.updated_at for f in findings), default=None)


def cached_figures(
    job: Job,
    findings: list[Finding],
    *,
    points: int,
    window: tuple[float, float] | None = None,
    captures: Sequence[charts.CaptureMark] = (),
    artifacts: list[tuple[int, str]] | None = None,
) -> dict[str, Any]:
    """`build_figures`, with the whole-job view shared through the cache: every viewer of a running job
    (and every one-minute refresh) between two polls gets the same figures, so under load a request reads
    one cache entry instead of re-reading and re-thinning the archive. Zooms are built per request (they
    read the window's rows only). `artifacts`: the job's (id, status) pairs for the key."""
    if window is not None:
        return build_figures(job, findings, points=points, window=window, captures=captures)
    states = artifacts if artifacts is not None else list(job.artifacts.values_list("id", "status"))
    key = _figures_key(job, _findings_stamp(findings), states, points)
    figures = cache.get(key)
    if figures is None:
        figures = build_figures(job, findings, points=points, captures=captures)
        cache.set(key, figures, FIGURES_CACHE_S)
    return figures


def _escape_script_json(text: str) -> str:
    """json_script's escaping of serialised JSON: it cannot close the <script> element or open a comment."""
    for char, escaped in _JSON_ESCAPES:
        text = text.replace(char, escaped)
    return text


def _page_figures(
    job: Job,
    findings: list[Finding],
    *,
    captures: Sequence[charts.CaptureMark],
    artifacts: list[tuple[int, str]],
) -> tuple[dict[str, Any], str]:
    """The job page's whole-job figures: what the template shows of them (labels, outliers, missing lines,
    archive step, whether there are series and a heatmap) and the `"timeseries":…,"heatmap":…` members of
    the page's JSON, serialised and escaped once per cache entry. A page view then neither unpickles the
    megabyte of figures nor re-encodes and re-escapes it."""
    key = _figures_key(job, _findings_stamp(findings), artifacts, charts.DEFAULT_POINTS) + ":page"
    cached = cache.get(key)
    if cached is None:
        figures = cached_figures(
            job, findings, points=charts.DEFAULT_POINTS, captures=captures, artifacts=artifacts
        )
        meta = {k: v for k, v in figures.items() if k not in ("timeseries", "heatmap")}
        meta["has_series"] = bool(figures["timeseries"].get("data"))
        meta["has_heatmap"] = bool(figures["heatmap"])
        members = dumps({"timeseries": figures["timeseries"], "heatmap": figures["heatmap"]}).decode()
        cached = (meta, _escape_script_json(members[1:-1]))
        cache.set(key, cached, FIGURES_CACHE_S)
    return cached[0], cached[1]


def _page_json(page_data: dict[str, Any], figure_members: str, element_id: str) -> str:
    """json_script of `page_data` with the figures' serialised, escaped members spliced in (the same
    element and JSON object as json_script(page_data | figures))."""
    head = _escape_script_json(dumps(page_data).decode())
    text = head[:-1] + ("," if len(head) > 2 else "") + figure_members + "}"
    return format_html('<script id="{}" type="application/json">{}</script>', element_id, mark_safe(text))


def _figures_json(job: Job, points: int, statuses: list[tuple[int, str]]) -> bytes:
    """The whole-job timeseries and heatmap as the JSON members of the refresh answer, from the cache:
    stored serialised next to the figures, so a refresh neither loads the findings and artifacts (one
    aggregate stands for the findings in the key) nor decodes and re-encodes a megabyte of figures."""
    stamp = job.findings.aggregate(n=Count("id"), at=Max("updated_at"))
    key = _figures_key(job, (stamp["n"], stamp["at"]), statuses, points) + ":json"
    body = cache.get(key)
    if body is None:
        figures = cached_figures(
            job, list(job.findings.all()), points=points, artifacts=statuses,
            captures=artifact_views.capture_marks(job.artifacts.all()),
        )  # fmt: skip
        body = dumps({"timeseries": figures["timeseries"], "heatmap": figures["heatmap"], "window": None})
        cache.set(key, body, FIGURES_CACHE_S)
    return bytes(body)


def build_figures(
    job: Job,
    findings: list[Finding],
    *,
    points: int,
    window: tuple[float, float] | None = None,
    captures: Sequence[charts.CaptureMark] = (),
) -> dict[str, Any]:
    """The time-series figure, the per-GPU heatmap and what is missing from them (2-3 queries)."""
    # Pre-downsampled levels: the coarsest archived step that still gives the pixel budget (x MINMAX_RATIO,
    # what the line's thinning picks from) and twice the heatmap's columns, so a request reads a bounded
    # number of values whatever the job's GPU-hours; a zoom reads finer levels over its window only.
    sigs = load_means(job, charts.CHART_SIGNALS, window, max_points=points * MINMAX_RATIO)
    reasons = dict(job.missing_reasons or {})
    heat_key = heatmap_signal(job)
    columns = 2 * charts.HEATMAP_COLUMNS
    per_gpu = load_per_gpu(job, heat_key, window, max_points=columns)
    if per_gpu is None and heat_key != "gpu_util":
        heat_key = "gpu_util"
        per_gpu = load_per_gpu(job, heat_key, window, max_points=columns)
    label = HEATMAP_LABELS[heat_key]
    gpu = job.gpu_model
    memory_gib = gpu.memory_mib / 1024 if gpu and gpu.memory_mib else None
    timeseries = charts.timeseries_figure(
        sigs,
        points=points,
        findings=finding_marks(findings),
        reasons=reasons,
        peak_clock_mhz=gpu.peak_clock_mhz if gpu else None,
        max_clock_mhz=gpu.max_clock_mhz if gpu else None,
        memory_gib=memory_gib,
        target_mfu=reference_mfu(job),
        window=window,
        captures=captures,
    )
    return {
        "timeseries": timeseries,
        "heatmap": charts.heatmap_figure(
            per_gpu, label, window=window, x_range=timeseries["layout"]["xaxis"].get("range")
        ),
        "heatmap_label": label,
        "heatmap_key": heat_key,
        "gpu_table": charts.gpu_table(per_gpu) if window is None else None,
        # A selector that matched no GPU is one ingestion error (shown once), not a missing line per signal.
        "missing": [] if no_gpus_matched(job) else charts.missing_lines(sigs, reasons),
        "archive_step_s": float(sigs.step) if sigs is not None else None,
    }


def kpis(job: Job) -> dict[str, str]:
    """The headline numbers as display strings; the page prints each unit next to its number, the refresh
    endpoint sends the same strings so the script can update them in place."""
    details = evaluation_details(job)

    def plain(text: str) -> str:
        return strip_tags(text).strip()

    return {
        "mfu": plain(pct(job.mfu)),
        "hfu": plain(pct(job.hfu)),
        "tokens_per_second": plain(num(job.tokens_per_second, 0)),
        "gpu_util": plain(pct(job.gpu_util_mean, 0)),
        "sm_active": plain(pct(job.sm_active_mean, 0)),
        "tensor_active": plain(pct(job.tensor_active_mean, 0)),
        "cost_per_day": plain(usd(job.cost_per_day_usd)),
        "waste_per_day": _waste_headline(job),
        "gpu_hours": plain(num(job.gpu_hours, 0)),
        # One format with the compare page (1.84 kWh, not "2"): two runs of 1.8 and 2.4 kWh read as 2 and 2.
        "energy": format_number(details.get("energy_kwh")),
        "cost_total": plain(money(job_cost_total(job), "total")),
        "waste_total": plain(money(job_waste_total(job), "total")),
    }


def _with_coverage(job: Job, key: str, definition: str) -> str:
    """The definition, plus "coverage 55 %" when the mean rests on less than 90 % of the job's GPU-time."""
    evaluated = job.evaluated
    note = coverage_note(evaluated.coverage.get(key)) if evaluated and key in evaluated.coverage else None
    return f"{definition}; {note} of the job's GPU-time has samples" if note else definition


def evaluation_details(job: Job) -> dict[str, Any]:
    """The stored evaluation decoded through its schema, as a dict for the template ({} before the first)."""
    evaluated = job.evaluated
    return encode(evaluated) if evaluated is not None else {}


def _waste_headline(job: Job) -> str:
    """'$1,234', 'at least $56' or 'unknown' (the definition line under it gives the reason)."""
    waste = job.waste_amount
    if waste.usd is None:
        return "unknown"
    value = format_usd(waste.usd)
    return f"at least {value}" if waste.lower_bound else value


def definitions(job: Job) -> dict[str, str]:
    """What each KPI means for this job: the MFU/HFU variant, throughput source, price and tier, waste
    reference (from the stored evaluation), with a generic fallback before the first evaluation."""
    details = evaluation_details(job)
    variants = details.get("variants") or {}
    return {
        "mfu": variants.get("mfu") or "model FLOPs per token × tokens/s ÷ (GPUs × dense peak FLOP/s)",
        "hfu": variants.get("hfu")
        or f"hardware FLOPs incl. recomputation ({job.get_recompute_display().lower()})",
        "throughput": variants.get("throughput") or "none yet: push progress or set a throughput query",
        "cost": details.get("price_note")
        or variants.get("cost")
        or "no price for this GPU model and tier in the price book",
        "waste": (variants.get("waste") or "cost/day × max(idle share, 1 − MFU ÷ reference MFU)")
        + (f"; total unknown: {job.waste_unknown_reason}" if job.waste_per_day_usd is None else ""),
        "energy": variants.get("energy") or "from DCGM energy counters or board power",
    }


def utilisation_verdict(job: Job) -> str:
    """One sentence contrasting nvidia-smi util with SM and tensor activity."""
    util, sm, tensor = job.gpu_util_mean, job.sm_active_mean, job.tensor_active_mean
    if util is None:
        return "No utilisation data yet."
    if sm is None:
        return (
            f"nvidia-smi reports {util * 100:.0f} % busy, but SM active is not collected, so busy cannot "
            "be told from saturated: enable DCGM_FI_PROF_SM_ACTIVE (see Signal readiness)."
        )
    tensor_text = f" and tensor cores {tensor * 100:.0f} % of cycles" if tensor is not None else ""
    if util >= 0.9 and sm < 0.5:
        return (
            f"nvidia-smi reports {util * 100:.0f} % busy, yet the SMs are active only {sm * 100:.0f} % of "
            f"cycles{tensor_text}: “busy” only means a kernel was running (false saturation)."
        )
    return (
        f"nvidia-smi reports {util * 100:.0f} % busy; SMs are active {sm * 100:.0f} % of cycles{tensor_text}."
    )


def no_gpus_matched(job: Job) -> str:
    """The ingestion's "selector matched 0 GPUs: ... PromQL" when no signal was found at all, else ''."""
    reasons = set((job.missing_reasons or {}).values())
    if len(reasons) == 1 and (reason := reasons.pop()).startswith(NO_GPUS_MATCHED):
        return str(reason)
    return ""


def _readiness(job: Job) -> dict[str, Any]:
    if job.last_polled_at is None:
        return {"polled": False, "missing": [], "present": []}
    missing_keys = set(job.missing_signals or [])
    reasons = job.missing_reasons or {}
    lines = readiness(k for k in SIGNALS if k not in missing_keys)
    no_gpus = no_gpus_matched(job)
    if no_gpus:  # one ingestion error with the PromQL, not one "missing field" row per signal
        return {"polled": True, "missing": [], "present": [], "no_gpus": no_gpus}
    return {
        "polled": True,
        "missing": [(line, reasons.get(line.key, "")) for line in lines if not line.present],
        "present": [line for line in lines if line.present],
    }


@require_GET
def job_detail(request: HttpRequest, external_id: str) -> HttpResponse:
    """The job page: KPIs with definitions, correlated time series with finding windows, per-GPU heatmap,
    findings ranked by $/day, artifacts and their analyses, baseline comparison, readiness."""
    job = _job_or_404(request, external_id)
    findings = list(job.findings.all())  # Finding.Meta.ordering: most $/day first
    artifacts = [artifact_views.present(a) for a in job.artifacts.select_related("uploaded_by")]
    figures, figure_members = _page_figures(
        job,
        findings,
        captures=artifact_views.capture_marks(v.artifact for v in artifacts),
        artifacts=[(v.artifact.pk, v.artifact.status) for v in artifacts],
    )
    comparison = baselines.compare(job)
    can_write = can_write_team(request.user, job.team)
    span_s = _job_span_s(job)
    marks, bands = _cached_finding_layout(job, findings, span_s)
    roofline = job_roofline_data(job)  # cached until the job changes: no query on a warm page
    # The page's JSON (element job-data) also carries "timeseries" and "heatmap": see _page_json.
    page_data = {
        "artifacts": artifact_views.figures_of(artifacts),
        "refresh_url": reverse("job-figures", args=[job.external_id]),
        "finding_bands": bands,
        "running": job.status == Job.Status.RUNNING,
        "refresh_s": REFRESH_S,
        "roofline": roofline["figure"],
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
            (key, label, value, _with_coverage(job, key, definition))
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
        **_findings_and_remainder(finding_views(findings, span_s, marks, wholes=[b["whole"] for b in bands])),
        "artifacts": artifacts,
        "kinds": Artifact.Kind.choices,
        "figures": figures,
        "page_data": page_data,
        "page_json": _page_json(page_data, figure_members, "job-data"),
        "comparison": comparison,
        "mfu_vs_baseline": mfu_row,
        "in_baseline": comparison is not None and job.pk in comparison.run_ids,
        # Runs promoted into the baseline despite hardware/health findings (one query, only with a baseline).
        "baseline_overrides": (
            list(comparison.baseline.overrides.select_related("user", "job")) if comparison else []
        ),
        "can_write": can_write,
        "can_promote": bool(job.config_fingerprint) and job.ended_at is not None,
        "promote_blockers": baselines.health_blockers(findings) if can_write else [],
        "readiness": _readiness(job),
        "resolution": resolution(figures["archive_step_s"], job.evaluated),
        "max_upload_mib": settings.ARTIFACT_MAX_BYTES // 2**20,
        "grafana_url": grafana_link(job),
        "roofline": roofline["summary"],
        "roofline_lines": roofline_page_lines(roofline["summary"]),
        "has_roofline_figure": roofline["figure"] is not None,
    }
    response = render(request, "jobs/job_detail.html", context)
    # The browser starts fetching the page's scripts when the response's headers arrive, before its renderer
    # has parsed the <head> (on a busy 2-core machine that was 100-150 ms later: benchmarks/cold_load.py).
    response["Link"] = preload_links(["vendor/plotly.min.js", "js/job.js"])
    return response


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
    minute while the job runs."""
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
    if request.GET.get("only") != "status":
        try:
            window = _window(request)
        except BadParameter as exc:
            return _json_response({"detail": str(exc)}, status=400)
        if window is None:  # the whole job: spliced in from the cache, already serialised
            head = dumps(body)
            response = HttpResponse(head[:-1] + b"," + _figures_json(job, _points(request), statuses)[1:],
                                    content_type="application/json")  # fmt: skip
            response["Cache-Control"] = "no-store"
            return response
        figures = build_figures(
            job,
            list(job.findings.all()),
            points=_points(request),
            window=window,
            captures=artifact_views.capture_marks(job.artifacts.all()),
        )
        body |= {"timeseries": figures["timeseries"], "heatmap": figures["heatmap"], "window": window}
    return _json_response(body)


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
