"""The API's exception handler: DRF's for expected errors, a JSON 500 with a logged error id otherwise."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.http import JsonResponse, UnreadablePostError
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

log = logging.getLogger("jobs.api")

INTERNAL_ERROR = "internal error; quote the error_id when reporting it"


def new_error_id() -> str:
    """A short id that ties a 500 answer to its traceback in the log."""
    return uuid.uuid4().hex[:16]


def log_unexpected(exc: BaseException, where: str) -> str:
    """Log `exc` with its traceback under a new error id, and return the id."""
    error_id = new_error_id()
    log.error("error_id=%s: unexpected %s at %s", error_id, type(exc).__name__, where, exc_info=exc)
    return error_id


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's answer for API exceptions, 404 and PermissionDenied; 408 for a body that stopped arriving;
    for anything else a JSON 500 `{"detail": ..., "error_id": ...}` (never an HTML debug page), with the
    id and traceback logged."""
    response = drf_exception_handler(exc, context)
    if response is not None:
        return response
    if isinstance(exc, UnreadablePostError):
        # The body stopped arriving (efficiency.webserver's body timeouts, or the client went away): the
        # client's 408, not a 500 with a traceback; the rest of the body is never read.
        return Response(
            {"detail": "request body not received in time"},
            status=status.HTTP_408_REQUEST_TIMEOUT,
            headers={"Connection": "close"},
        )
    request = context.get("request")
    error_id = log_unexpected(exc, getattr(request, "path", "?"))
    set_rollback()
    return Response(
        {"detail": INTERNAL_ERROR, "error_id": error_id}, status=status.HTTP_500_INTERNAL_SERVER_ERROR
    )


def json_500(exc: BaseException, path: str) -> JsonResponse:
    """The same JSON 500 outside DRF (middleware, plain Django views under /api/)."""
    error_id = log_unexpected(exc, path)
    return JsonResponse({"detail": INTERNAL_ERROR, "error_id": error_id}, status=500)
