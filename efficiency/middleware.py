"""Project-wide middleware: login required for pages, and a strict Content-Security-Policy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth.middleware import LoginRequiredMiddleware as _DjangoLoginRequired
from django.http import HttpRequest, HttpResponse, HttpResponseBase

# Machines authenticate to these with tokens (DRF does that inside the view), or they are public probes.
_EXEMPT_PREFIXES = ("/api/", "/healthz", "/metrics", "/static/", "/simulated/")

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        # Plotly writes style attributes and a <style> element at run time; scripts stay strict.
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:",
        "font-src 'self' data:",
        "worker-src 'self' blob:",  # the API docs page (Redoc) runs a web worker from a blob
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


class LoginRequiredMiddleware(_DjangoLoginRequired):
    """Django's login-required middleware, except for the API (token auth) and public probes."""

    def process_view(
        self,
        request: HttpRequest,
        view_func: Callable[..., HttpResponseBase],
        view_args: tuple[Any, ...],
        view_kwargs: dict[Any, Any],
    ) -> HttpResponseBase | None:
        if request.path.startswith(_EXEMPT_PREFIXES):
            return None
        return super().process_view(request, view_func, view_args, view_kwargs)


class ContentSecurityPolicyMiddleware:
    """Adds the CSP header: no inline or third-party scripts anywhere in the app."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        return response
