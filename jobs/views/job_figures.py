"""The job page's figures: the time series and per-GPU heatmap built from the archive (`build_figures`),
cached per job version for the page and its one-minute refresh, and the query parameters of the figures
endpoint (zoom window, pixel budget)."""

from __future__ import annotations

import gzip
import hashlib
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.core.cache import cache
from django.db.models import Count, Max
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.cache import patch_vary_headers

from jobs import charts
from jobs.evaluation.load import reference_mfu
from jobs.metrics.archive import load_means, load_per_gpu
from jobs.metrics.downsample import MINMAX_RATIO
from jobs.models import Finding, Job
from jobs.views import artifacts as artifact_views
from jobs.views.job_findings import finding_bands, finding_marks, finite
from jobs.views.job_summary import no_gpus_matched
from jobs.views.page_json import dumps, escape_script_json

HEATMAP_LABELS = {"sm_active": "SM active", "gpu_util": "nvidia-smi util"}


def cached_finding_layout(
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


class BadParameter(ValueError):
    """A malformed query parameter of the figures endpoint (answered with a 400)."""


# Zoom windows must lie between 2000 and a day from now (datetime cannot represent 1e20 s).
_EARLIEST_UNIX = datetime(2000, 1, 1, tzinfo=UTC).timestamp()


def zoom_window(request: HttpRequest) -> tuple[float, float] | None:
    raw_start, raw_end = request.GET.get("start"), request.GET.get("end")
    if not raw_start and not raw_end:
        return None
    start, end = finite(raw_start), finite(raw_end)
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


def points_param(request: HttpRequest) -> int:
    value = finite(request.GET.get("points"))
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


def page_figures(
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
        cached = (meta, escape_script_json(members[1:-1]))
        cache.set(key, cached, FIGURES_CACHE_S)
    return cached[0], cached[1]


def figures_json(job: Job, points: int, statuses: list[tuple[int, str]]) -> tuple[bytes, str]:
    """The whole-job timeseries and heatmap as the JSON members of the refresh answer, from the cache:
    stored serialised next to the figures, so a refresh neither loads the findings and artifacts (one
    aggregate stands for the findings in the key) nor decodes and re-encodes a megabyte of figures. With
    the cache key, which names the figures' version."""
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
    return bytes(body), key


# As django.middleware.gzip reads Accept-Encoding.
_ACCEPTS_GZIP = re.compile(r"\bgzip\b")
#: zlib's default: the whole-job answer (~660 kB for 256 GPUs x 7 days) compresses to about a fifth, once
#: per figures version and head (jobs.views.job.job_figures' status part), then comes from the cache.
GZIP_LEVEL = 6


def whole_job_response(
    request: HttpRequest, job: Job, head: bytes, points: int, statuses: list[tuple[int, str]]
) -> HttpResponse:
    """The refresh answer for the whole job: `head` (the serialised status part) with the cached figures
    spliced in, gzip-compressed for a client that accepts it. The page polls this every minute while the job
    runs, and uncompressed it is most of a megabyte each time (nginx in front compresses nothing:
    efficiency/deploy/nginx.conf); the compressed answer is cached per figures version and head, so only
    the first viewer after a poll pays for compressing it. (Nothing secret and nothing the request sends is
    in it, so compression leaks nothing of the BREACH kind.)"""
    members, key = figures_json(job, points, statuses)
    body = head[:-1] + b"," + members[1:]
    gzipped = accepts_gzip(request)
    if gzipped:
        gzip_key = f"{key}:gzip:{hashlib.sha256(head).hexdigest()}"
        compressed = cache.get(gzip_key)
        if compressed is None:
            # mtime=0: the same bytes for the same answer (gzip's header otherwise carries the time).
            compressed = gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)
            cache.set(gzip_key, compressed, FIGURES_CACHE_S)
        body = bytes(compressed)
    return figures_answer(body, gzipped)


def accepts_gzip(request: HttpRequest) -> bool:
    """Whether the client takes a gzip-encoded answer (its Accept-Encoding names gzip)."""
    return bool(_ACCEPTS_GZIP.search(request.headers.get("Accept-Encoding", "")))


def figures_answer(content: bytes, gzipped: bool) -> HttpResponse:
    """The whole-job figures answer around its (gzipped or plain) bytes: never stored by a browser or proxy
    (it is a team's data), varying with Accept-Encoding."""
    response = HttpResponse(content, content_type="application/json")
    response["Cache-Control"] = "no-store"
    patch_vary_headers(response, ("Accept-Encoding",))
    if gzipped:
        response["Content-Encoding"] = "gzip"
    return response


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
