"""List filters, once per list (django-filter). The job list's: the page (`/`), its CSV export
(`/jobs.csv`) and the API (`GET /api/v1/jobs/`) read the same query string through `JobFilterSet`, so
they list the same jobs.

Query string: `q` (substring of the name or external id, any case), `mine=1` (owner = the logged-in
username, any case), `team` (slug), `owner` (any case), `model`, `gpu` (GPU model name), `status` (a job
status), `since` / `until` (YYYY-MM-DD, the start date; `until` includes its day) and `sort` (`started`,
`mfu`, `waste`, `-` first for descending; default `-started`). A value that cannot be read (a date that is
not one, an unknown status) is an error that names it; the other filters still apply, and each caller says
so its own way (the page shows it with 400, the CSV and the API answer 400). The baselines list's
(`BaselineFilterSet`) is shared by its page and the API the same way.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import django_filters
from django import forms
from django.db.models import F, Q, QuerySet
from django.http import HttpRequest, QueryDict
from django.utils import timezone
from django.utils.dateparse import parse_date
from rest_framework.request import Request

from jobs.models import Baseline, Job
from jobs.outputs.leaderboard import MAX_YEAR, MIN_YEAR

#: The filter keys of the query string, in the order the page's form shows them (the sort is apart).
FILTER_KEYS = ("q", "mine", "team", "owner", "model", "gpu", "status", "since", "until")
SORTS = {
    "mfu": "mfu",
    "-mfu": "-mfu",
    "waste": "waste_per_day_usd",
    "-waste": "-waste_per_day_usd",
    "started": "started_at",
    "-started": "-started_at",
}
DEFAULT_SORT = "-started"
#: What each query-string key does, for the API's schema (the page's form says it in its own words).
JOB_FILTER_HELP = {
    "q": "Substring of the job's name or external id, any case",
    "mine": "1: only the logged-in user's jobs (owner, any case)",
    "team": "Team slug",
    "owner": "Owner, any case",
    "model": "Model name",
    "gpu": "GPU model name",
    "status": "Job status",
    "since": "Started on or after this day (YYYY-MM-DD)",
    "until": "Started on or before this day (YYYY-MM-DD)",
    "sort": "started, mfu or waste; '-' first for descending (default -started; unknown MFU/waste last)",
}


def filter_date(text: str) -> date | None:
    """A YYYY-MM-DD filter value within the years periods may have, or None (2026-02-30, 9999-12-31)."""
    try:
        day = parse_date(text) if len(text) == 10 else None
    except ValueError:  # well formed but not a date
        return None
    return day if day is not None and MIN_YEAR <= day.year <= MAX_YEAR else None


class _DayField(forms.CharField):
    """A start-date filter: YYYY-MM-DD within MIN_YEAR..MAX_YEAR."""

    def clean(self, value: Any) -> date | None:
        text = super().clean(value)
        if not text:
            return None
        day = filter_date(text)
        if day is None:
            raise forms.ValidationError(f"is not a date (YYYY-MM-DD, years {MIN_YEAR}-{MAX_YEAR})")
        return day


class _DayFilter(django_filters.Filter):
    field_class = _DayField


class _StatusField(forms.CharField):
    """A job status (`running`, ...): an unknown one is an error rather than an empty list."""

    def clean(self, value: Any) -> str:
        text = str(super().clean(value))
        if text and text not in Job.Status.values:
            raise forms.ValidationError(f"is not a job status ({', '.join(Job.Status.values)})")
        return text


class _StatusFilter(django_filters.CharFilter):
    field_class = _StatusField


def _midnight(day: date) -> datetime:
    return datetime.combine(day, datetime.min.time(), tzinfo=timezone.get_current_timezone())


class JobFilterSet(django_filters.FilterSet):
    """The job list's filters and sort (see the module docstring); `request` gives `mine` its user."""

    q = django_filters.CharFilter(method="filter_search")
    mine = django_filters.CharFilter(method="filter_mine")
    team = django_filters.CharFilter(field_name="team__slug")
    owner = django_filters.CharFilter(field_name="owner", lookup_expr="iexact")
    model = django_filters.CharFilter(field_name="model_name")
    gpu = django_filters.CharFilter(field_name="gpu_model__name")
    status = _StatusFilter(field_name="status")
    since = _DayFilter(method="filter_since")
    until = _DayFilter(method="filter_until")
    # Read in filter_queryset (the order applies with or without a value); unknown sorts fall back.
    sort = django_filters.CharFilter(method="filter_nothing")

    class Meta:
        model = Job
        fields: list[str] = []

    def filter_search(self, queryset: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        """Substring of the name or the external id, any case."""
        return queryset.filter(Q(name__icontains=value) | Q(external_id__icontains=value))

    def filter_mine(self, queryset: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        """`mine=1`: the logged-in user's jobs (owner, any case); another value is the unticked box."""
        if value != "1" or self.request is None or not self.request.user.is_authenticated:
            return queryset
        return queryset.filter(owner__iexact=self.request.user.get_username())

    def filter_since(self, queryset: QuerySet[Job], name: str, value: date) -> QuerySet[Job]:
        """Started on or after that day (the server's time zone)."""
        return queryset.filter(started_at__gte=_midnight(value))

    def filter_until(self, queryset: QuerySet[Job], name: str, value: date) -> QuerySet[Job]:
        """Started on or before that day: "until 2026-11-30" includes that day."""
        return queryset.filter(started_at__lt=_midnight(value) + timedelta(days=1))

    def filter_nothing(self, queryset: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        """The sort is applied by `filter_queryset`, after every filter."""
        return queryset

    def _raw(self, key: str) -> str:
        """A query-string value as given, stripped ("" when absent)."""
        return str((self.data or {}).get(key, "")).strip()

    @property
    def ordering(self) -> str:
        """The sort applied: the query string's when known, else DEFAULT_SORT."""
        wanted = self._raw("sort")
        return wanted if wanted in SORTS else DEFAULT_SORT

    def filter_queryset(self, queryset: QuerySet[Job]) -> QuerySet[Job]:
        """Every readable filter, then the sort (jobs without the sorted number last either way)."""
        queryset = super().filter_queryset(queryset)
        order = SORTS[self.ordering]
        field = order.lstrip("-")
        if field == "started_at":  # never null: a plain order can walk an index on started_at
            return queryset.order_by(order, "-pk")
        ordered = F(field).desc(nulls_last=True) if order.startswith("-") else F(field).asc(nulls_last=True)
        return queryset.order_by(ordered, "-started_at", "-pk")

    def problems(self) -> list[str]:
        """One sentence per filter value that could not be read (that filter was ignored)."""
        out = []
        for key, messages in self.errors.items():
            raw = self._raw(key)
            for message in messages:
                out.append(f"'{raw}' {message}; the {key} filter was ignored.")
        return out

    def shown(self) -> dict[str, str]:
        """The filter values as given (stripped; `mine` only as "1"), for the page's form and its links."""
        values = {key: self._raw(key) for key in FILTER_KEYS}
        if values["mine"] != "1":
            values["mine"] = ""
        return values


def job_filterset(
    request: HttpRequest | Request, queryset: QuerySet[Job], data: QueryDict | None = None
) -> JobFilterSet:
    """The job list's FilterSet bound to the request's query string (or `data`, e.g. DRF's query_params)."""
    return JobFilterSet(request.GET if data is None else data, queryset=queryset, request=request)


def filters_query(filters: dict[str, str]) -> str:
    """The given filters as a query string (empty ones left out), for links that keep them."""
    return urlencode({k: v for k, v in filters.items() if v})


class BaselineFilterSet(django_filters.FilterSet):
    """The baselines list's filters, for the page (`/baselines/`) and the API (`/api/v1/baselines/`):
    `include_retired=1` shows retired baselines too (active ones only otherwise), `fingerprint` one
    model + config."""

    include_retired = django_filters.CharFilter(method="filter_nothing")
    fingerprint = django_filters.CharFilter(field_name="fingerprint")

    class Meta:
        model = Baseline
        fields: list[str] = []

    def filter_nothing(self, queryset: QuerySet[Baseline], name: str, value: str) -> QuerySet[Baseline]:
        """`include_retired` is applied by `filter_queryset`, with or without a value."""
        return queryset

    @property
    def shows_retired(self) -> bool:
        """Whether retired baselines are listed (`include_retired=1`)."""
        return str((self.data or {}).get("include_retired", "")).strip() == "1"

    def filter_queryset(self, queryset: QuerySet[Baseline]) -> QuerySet[Baseline]:
        """Every filter, then retired baselines left out unless asked for."""
        queryset = super().filter_queryset(queryset)
        return queryset if self.shows_retired else queryset.filter(retired_at__isnull=True)
