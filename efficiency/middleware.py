"""Project-wide middleware: request limits in front of everything that reads a body, login required for
pages, a strict Content-Security-Policy, and a JSON 500 for unexpected errors under /api/."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.middleware import LoginRequiredMiddleware as _DjangoLoginRequired
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse, UnreadablePostError
from django.urls import reverse

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


def _refuse(request: HttpRequest, status: int, message: str) -> HttpResponse:
    if request.path_info.startswith("/api/"):
        response: HttpResponse = JsonResponse({"detail": message}, status=status)
        if status == 401:
            response["WWW-Authenticate"] = "Token"
    else:
        response = HttpResponse(f"{message}\n", status=status, content_type="text/plain; charset=utf-8")
    if status in (408, 413):
        response["Connection"] = "close"  # the unread body must not be taken for the next request
    return response


class RequestLimitsMiddleware:
    """Refuses, from the request line and headers alone, before CSRF or any view reads the body:

    * NUL, control characters or lone surrogates in the path or a query parameter (400);
    * a Content-Length that is not a number (400), or larger than DATA_UPLOAD_MAX_MEMORY_SIZE (413) —
      or, on the artifact upload URLs, larger than ARTIFACT_MAX_BYTES plus the multipart margin;
    * an upload by an anonymous caller (401, or the login page for the job page's form), by someone who
      may not write to the job's team (403), or to an unknown job (404); an accepted upload gets the
      streaming size limit (`jobs.intake.uploads.LimitedUploadHandler`).

    Placed after SessionMiddleware (it reads the session cookie) and before CsrfViewMiddleware.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        from jobs.api.parsers import text_problem
        from jobs.intake.uploads import MULTIPART_MARGIN_BYTES, UploadRefusal, authorise_upload, upload_target

        if problem := text_problem(request.path_info):
            return _refuse(request, 400, f"the path {problem}")
        for key, values in request.GET.lists():
            for text in (key, *values):
                if problem := text_problem(text):
                    return _refuse(request, 400, f"query parameter {key!r} {problem}")
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return _refuse(request, 400, "Content-Length is not a number")
        external_id = upload_target(request)
        if external_id is None:
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            if limit is not None and length > limit + MULTIPART_MARGIN_BYTES:
                return _refuse(request, 413, f"request body larger than {limit} bytes")
            return self.get_response(request)
        api = request.path_info.startswith("/api/")
        try:
            authorise_upload(request, external_id, api=api)
        except UploadRefusal as refusal:
            if refusal.status == 401 and not api:
                # Back to the job page after the login (the upload URL itself only takes POSTs).
                return redirect_to_login(reverse("job-detail", args=[external_id]))
            return _refuse(request, refusal.status, refusal.message)
        from jobs.intake.uploads import install_upload_limit

        install_upload_limit(request)
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        """A body that stopped arriving (the web server's body timeouts, `efficiency.webserver`, or a
        client that went away) is the client's 408, not a server error with a traceback."""
        if isinstance(exception, UnreadablePostError):
            return _refuse(request, 408, "request body not received in time")
        return None


class ApiErrorMiddleware:
    """An unexpected exception under /api/ that DRF did not handle becomes a JSON 500 with an error id
    (logged with the traceback), never Django's HTML debug page."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not request.path_info.startswith("/api/") or isinstance(exception, UnreadablePostError):
            return None  # RequestLimitsMiddleware answers an unreadable body (408)
        from jobs.api.errors import json_500

        return json_500(exception, request.path_info)
