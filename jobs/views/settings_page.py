"""The staff settings page: every environment variable the service read at start-up, its value in force and
where it came from (environment or default), secrets masked (issue 28: nothing showed an admin the
effective settings)."""

from __future__ import annotations

import os

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from efficiency.env import READS, effective_settings
from jobs.access.permissions import is_staff


@require_GET
def effective_settings_page(request: HttpRequest) -> HttpResponse:
    """Staff only (403 otherwise): the table of effective settings."""
    if not is_staff(request.user):
        raise PermissionDenied("the effective settings are shown to staff only")
    lookup = {name: getattr(settings, name) for name in READS if hasattr(settings, name)}
    rows = effective_settings(READS, lookup, os.environ)
    return render(
        request,
        "jobs/settings.html",
        {"rows": rows, "from_env": sum(1 for r in rows if r.source == "environment")},
    )
