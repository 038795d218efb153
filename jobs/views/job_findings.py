"""The job page's findings: their windows and chart marks (number, colour), the listed views with zoom
targets and evidence lines, the bands the page's script shades at each zoom, and the split of the ranked
causes from the unexplained remainder."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.utils import timezone

from jobs import charts
from jobs.models import Finding, Job
from jobs.models.jobs import REMAINDER_CODE
from jobs.outputs.numbers import format_number


def finite(value: Any) -> float | None:
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
            start, end = finite(w[0]), finite(w[1])
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


def findings_and_remainder(views: list[FindingView]) -> dict[str, Any]:
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


def job_span_s(job: Job) -> float:
    end = job.ended_at or job.data_until or timezone.now()
    return max(0.0, (end - job.started_at).total_seconds())
