"""The weekly cost-waste email's text and HTML parts from a built `report_content.WeeklyReport`, with the
pages' number formats (so a figure reads the same in the email and on the leaderboard); the text part is
wrapped at `TEXT_WIDTH` without breaking URLs.
"""

from __future__ import annotations

import re
import textwrap
from datetime import timedelta

from django.conf import settings
from django.template.loader import render_to_string
from django.urls import reverse

from jobs.evaluation.costs import Amount, format_usd
from jobs.evaluation.kpis import CONVENTION_LABELS
from jobs.outputs.report_content import MIN_LISTED_WASTE_USD, WeeklyReport, absolute_url
from jobs.templatetags import units

#: The text part is wrapped at this width (RFC 5322 recommends lines of at most 78 characters).
TEXT_WIDTH = 78


_NA = "n/a"


def _pct(value: float | None) -> str:
    return _NA if value is None else units.pct(value)


def _usd(value: float | None) -> str:
    return _NA if value is None else units.usd(value)


def _hours(value: float | None) -> str:
    return _NA if value is None else f"{units.num(value, 1)} GPU-h"


def _signed_usd(value: float | None) -> str:
    return _NA if value is None else units.signed_usd(value)


def _short(amount: Amount) -> str:
    """An amount without its reason, for the subject line: '$1,234' or 'at least $56'."""
    text = format_usd(amount.usd) if amount.usd is not None else "unknown"
    return f"at least {text}" if amount.lower_bound else text


def _one_line(value: str) -> str:
    # Header injection guard: team names are free text, and a newline in a subject is refused by Django.
    return " ".join(value.split())


def _bar(value: float, top: float) -> int:
    return round(100 * value / top) if top > 0 else 0


def _context(report: WeeklyReport) -> dict[str, object]:
    period, previous = report.period, report.previous
    last_day = period.end - timedelta(days=1)
    share = report.row.waste_share if report.row else None
    prev = report.previous_row
    change = report.waste_change_usd
    if change is None and report.previous_row is not None:
        change_s = f"{_NA} (waste only bounded below in one of the weeks)"
    elif change is None:
        change_s = f"{_NA} (no jobs in {previous.label})"
    else:
        change_s = f"{_signed_usd(change)} (from {_usd(report.previous_waste_usd)} in {previous.label})"
    rank_s = f"#{report.rank} of {report.teams_ranked} teams" if report.rank else _NA
    kpis = [
        ("GPU hours", _hours(report.gpu_hours), "GPUs × hours each job ran inside the week"),
        ("Cost", report.cost.text(), "USD for those hours, at each job's price tier"),
        ("Weighted MFU", _pct(report.weighted_mfu), "model FLOPs utilisation, weighted by GPU hours"),
        (
            "Waste",
            f"{report.waste.text()} ({'at least ' if report.waste.lower_bound else ''}{_pct(share)} of cost)",
            "USD lost: per job cost × max(idle share, 1 − MFU ÷ reference MFU); no MFU: the idle part only",
        ),
        (f"Waste vs {previous.label}", change_s, "positive = more waste than last week"),
        ("Leaderboard", rank_s, "teams ranked by weighted MFU, as on the leaderboard page"),
    ]
    top = max(report.cost_usd, prev.cost_usd if prev else 0.0)
    chart = [
        (f"Cost {period.label}", _usd(report.cost_usd), _bar(report.cost_usd, top), "#4a6fa5"),
        (
            f"Waste {period.label}",
            report.waste.text(),
            _bar(report.row.waste_lower_bound_usd if report.row else 0.0, top),
            "#c0392b",
        ),
    ]
    if prev:
        chart += [
            (f"Cost {previous.label}", _usd(prev.cost_usd), _bar(prev.cost_usd, top), "#9fb3d1"),
            (f"Waste {previous.label}", prev.waste.text(), _bar(prev.waste_lower_bound_usd, top), "#e2a39c"),
        ]
    jobs = [
        {
            "line": line,
            "mfu": _pct(line.mfu),
            "gpu_hours": _hours(line.gpu_hours),
            "waste": Amount(line.waste_usd, line.waste_is_lower_bound, line.waste_unknown_reason).text(),
            "finding_waste": (
                "impact unknown"
                if line.finding_title and line.finding_waste_per_day_usd is None
                else _usd(line.finding_waste_per_day_usd) + "/day"
            ),
        }
        for line in report.top_jobs
    ]
    return {
        "report": report,
        "team_name": _one_line(report.team.name),
        "week": period.label,
        "dates": f"{period.start:%a %d %b} – {last_day:%a %d %b %Y} (UTC)",
        "kpis": kpis,
        "chart": [{"label": c[0], "value": c[1], "pct": c[2], "color": c[3]} for c in chart],
        "jobs": jobs,
        "small_jobs": (
            f"{report.small_jobs} more job{'s' if report.small_jobs != 1 else ''} wasted under "
            f"{_usd(MIN_LISTED_WASTE_USD)} each: {_usd(report.small_jobs_waste_usd)} in total."
            if report.small_jobs
            else ""
        ),
        "min_listed": _usd(MIN_LISTED_WASTE_USD),
        "price_tiers": ", ".join(report.price_tiers) or _NA,
        "target_mfu": _pct(settings.TARGET_MFU),
        "target_mfu_fp8": _pct(settings.TARGET_MFU_FP8),
        "mfu_convention": CONVENTION_LABELS[settings.MFU_FLOPS_CONVENTION],
        "waste_unknown": report.row.waste_unknown_reason if report.row else "",
        "mfu_fallback": report.row.jobs_mfu_fallback if report.row else 0,
        "low_coverage": report.row.jobs_low_coverage if report.row else 0,
        "leaderboard_url": absolute_url(reverse("leaderboard")) + f"?week={period.label}",
        "team_url": absolute_url(reverse("team-detail", args=[report.team.slug])),
    }


def render_report(report: WeeklyReport) -> tuple[str, str, str]:
    """(subject, text part, HTML part). The HTML part escapes user text; the text part is raw by design,
    so neither may be embedded in a page without escaping."""
    ctx = _context(report)
    # ASCII separators: a non-ASCII subject is RFC 2047-encoded and folded, which some clients show oddly.
    if report.has_activity:
        subject = (
            f"{ctx['team_name']} {report.period.label}: {_short(report.waste)} wasted of "
            f"{_short(report.cost)}, MFU {_pct(report.weighted_mfu)}"
        )
    else:
        subject = f"{ctx['team_name']} {report.period.label}: no GPU hours"
    ctx["subject"] = subject
    text = wrap_text(render_to_string("emails/weekly_report.txt", ctx))
    html = render_to_string("emails/weekly_report.html", ctx)
    return subject, text, html


def wrap_text(text: str, width: int = TEXT_WIDTH) -> str:
    """`text` with every line longer than `width` wrapped at word boundaries, continuation lines indented
    like the line's text (after a "- " or "1. " marker), so lists stay lists. Words longer than the width
    (URLs) are kept whole on a line of their own: a broken URL is worse than a long line."""
    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        lead = line[: len(line) - len(line.lstrip(" "))]
        marker = re.match(r"\s*(?:-\s|\d+\.\s)?\s*", line)
        indent = " " * (marker.end() if marker else 0)
        wrapped = textwrap.wrap(
            line[len(lead) :],
            width=width,
            initial_indent=lead,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )
        out.extend(wrapped or [line])
    return "\n".join(out)
