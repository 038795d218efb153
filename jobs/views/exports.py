"""CSV exports, streamed: the job list (the filtered set), the leaderboard and a job's archived series.

Every figure is the stored one (the job's columns, the leaderboard's one aggregation, the archive readers);
a unit is in every header, in the words the pages use (`$ total`, `$/day`, `$ this week`). An unknown
number is an empty cell, never 0, with a `... kind` column saying `exact`, `at least` or `unknown`.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

import numpy as np
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.http import require_GET

from jobs.access.permissions import readable_job_or_404
from jobs.evaluation.costs import Amount
from jobs.metrics.archive import load_job_signals, load_per_gpu
from jobs.metrics.host_signals import HOST_SIGNALS
from jobs.metrics.signals import COUNT, NONZERO, SAMPLED, SIGNALS, THROTTLE_BITS
from jobs.models import Job
from jobs.templatetags.units import job_cost_total, job_waste_total, money_header
from jobs.views.pages import filter_jobs, leaderboard_context

#: Characters that make a spreadsheet read a cell as a formula (CSV injection): text cells starting with
#: one get a leading apostrophe. Numbers are written as numbers.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


class _Echo:
    """A file-like object whose write returns the line: csv.writer then yields rows one by one."""

    def write(self, value: str) -> str:
        return value


def _text(value: Any) -> str:
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def _number(value: float | None, digits: int) -> str:
    if value is None or not math.isfinite(value):
        return ""
    return f"{value:.{digits}f}"


def _time(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _amount(value: Amount) -> list[str]:
    """[number, kind, reason]: an unknown amount is an empty cell, never 0."""
    if value.usd is None:
        return ["", "unknown", _text(value.reason)]
    return [_number(value.usd, 2), "at least" if value.lower_bound else "exact", _text(value.reason)]


def stream_csv(filename: str, header: list[str], rows: Iterable[list[str]]) -> StreamingHttpResponse:
    """A streamed CSV download (UTF-8, one row at a time)."""
    writer = csv.writer(_Echo())

    def lines() -> Iterator[str]:
        yield writer.writerow(header)
        for row in rows:
            yield writer.writerow(row)

    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["Cache-Control"] = "private, no-store"
    return response


JOB_LIST_HEADER = [
    "job id", "name", "team", "owner", "model", "GPUs", "GPU model", "status", "started (UTC)",
    "ended (UTC)", "MFU (ratio 0-1)", "SM active (ratio 0-1)",
    money_header("cost", "total"), "cost kind", "cost reason",
    money_header("waste", "total"), "waste kind", "waste reason",
    money_header("waste", "day"), "waste/day kind", "waste/day reason",
]  # fmt: skip


def job_list_row(job: Job) -> list[str]:
    """One job as the list shows it; waste/day only for a running job (as on the page)."""
    per_day = _amount(job.waste_amount) if job.is_running else ["", "ended", ""]
    return [
        _text(job.external_id),
        _text(job.name),
        _text(job.team.name),
        _text(job.owner),
        _text(job.model_name),
        str(job.gpu_count),
        _text(job.gpu_model.name if job.gpu_model else job.gpu_model_name),
        job.status,
        _time(job.started_at),
        _time(job.ended_at),
        _number(job.mfu, 4),
        _number(job.sm_active_mean, 4),
        *_amount(job_cost_total(job)),
        *_amount(job_waste_total(job)),
        *per_day,
    ]


@require_GET
def job_list_csv(request: HttpRequest) -> HttpResponseBase:
    """The job list's filtered, sorted set (every page of it) as CSV."""
    found = filter_jobs(request)
    if found.errors:
        return HttpResponse("\n".join(found.errors), status=400, content_type="text/plain; charset=utf-8")
    rows = (job_list_row(job) for job in found.queryset.iterator(chunk_size=500))
    return stream_csv("jobs.csv", JOB_LIST_HEADER, rows)


@require_GET
def leaderboard_csv(request: HttpRequest) -> HttpResponseBase:
    """The leaderboard's team table for the same period and sort as the page."""
    context = leaderboard_context(request)
    if context["errors"]:
        return HttpResponse(
            "\n".join(context["errors"]), status=400, content_type="text/plain; charset=utf-8"
        )
    by = context["by"]
    period = context["period"]
    header = [
        "rank", "team", "team slug", "period", "weighted MFU (ratio 0-1)", "GPU hours (GPU-h)",
        money_header("cost", by), "cost kind", "cost reason",
        money_header("waste", by), "waste kind", "waste reason", "jobs",
    ]  # fmt: skip

    def rows() -> Iterator[list[str]]:
        for rank, item in enumerate(context["table"], start=1):
            r = item.row
            yield [
                str(rank),
                _text(r.team_name),
                _text(r.team_slug),
                period.label,
                _number(r.weighted_mfu, 4),
                _number(r.gpu_hours, 2),
                *_amount(r.cost),
                *_amount(r.waste),
                str(r.jobs),
            ]

    return stream_csv(f"leaderboard-{period.label}.csv", header, rows())


def _unit(key: str, unit: str) -> str:
    if unit:
        return unit
    if key in HOST_SIGNALS:
        return HOST_SIGNALS[key].unit
    return SIGNALS[key].unit if key in SIGNALS else ""


def _stat_unit(key: str, stat: str, unit: str) -> str:
    """The unit of one aggregate: GPUs for the counts, GPUs with a nonzero code, else the signal's unit."""
    if stat == COUNT:
        return "hosts reporting" if key in HOST_SIGNALS else "GPUs reporting"
    if stat == SAMPLED:
        return "GPUs' worth of samples"
    if stat == NONZERO:
        return "GPUs with a nonzero code"
    if stat in THROTTLE_BITS:
        return "GPUs with the reason set"
    return _unit(key, unit)


@require_GET
def job_series_csv(request: HttpRequest, external_id: str) -> HttpResponseBase:
    """A job's archived series: every signal's cross-GPU mean/min/max (?signal=KEY for one), or one
    signal per GPU (?signal=KEY&per_gpu=1), one row per archived time step."""
    job = readable_job_or_404(request.user, external_id=external_id)
    signal = request.GET.get("signal", "").strip()
    per_gpu = request.GET.get("per_gpu") == "1"
    if (
        signal
        and signal not in SIGNALS
        and signal not in HOST_SIGNALS
        and signal not in ("tokens_per_second", "mfu")
    ):
        return HttpResponse(f"unknown signal {signal!r}", status=400, content_type="text/plain")
    if per_gpu:
        if not signal:
            return HttpResponse("per_gpu=1 needs ?signal=KEY", status=400, content_type="text/plain")
        series = load_per_gpu(job, signal)
        if series is None or series.per_gpu is None or series.gpu_timestamps is None:
            return HttpResponse(
                f"no per-GPU series of {signal} archived", status=404, content_type="text/plain"
            )
        unit = _unit(signal, series.unit)
        header = ["time (UTC)", *(f"{signal} {gpu} ({unit})" for gpu in series.gpus)]
        lines = [series.per_gpu[i] for i in range(len(series.gpus))]
        name = f"{job.external_id}-{signal}-per-gpu.csv"
        return stream_csv(name, header, _matrix_rows(series.gpu_timestamps, lines))
    sigs = load_job_signals(job, per_gpu=False, signals=[signal] if signal else None)
    if sigs is None:
        return HttpResponse("no series archived for this job", status=404, content_type="text/plain")
    columns: list[str] = []
    values: list[np.ndarray] = []
    for key in sorted(sigs.signals):
        s = sigs.signals[key]
        for stat in sorted(s.stats):
            columns.append(f"{key} {stat} ({_stat_unit(key, stat, s.unit)})")
            values.append(s.stats[stat])
    name = f"{job.external_id}-{signal or 'signals'}.csv"
    return stream_csv(name, ["time (UTC)", *columns], _matrix_rows(sigs.timestamps, values))


def _matrix_rows(stamps: np.ndarray, lines: list[np.ndarray]) -> Iterator[list[str]]:
    """One CSV row per time step: the time, then each line's value there (empty where no sample)."""
    for i, t in enumerate(stamps):
        row = [datetime.fromtimestamp(float(t), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")]
        for line in lines:
            v = float(line[i]) if i < line.size else math.nan
            row.append("" if not math.isfinite(v) else repr(round(v, 6)))
        yield row
