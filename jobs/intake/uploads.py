"""Artifact uploads are authorised before their body is read, and their body is bounded while it streams.

Two URLs take uploads: the job page's form (`/jobs/<id>/artifacts/`, session login) and the API
(`/api/v1/jobs/<id>/artifacts/`, token or session). For both, `efficiency.middleware.RequestLimitsMiddleware`
(placed before the CSRF middleware, which reads POST bodies) refuses from the headers alone: a
Content-Length above ARTIFACT_MAX_BYTES plus a small multipart margin (413), an anonymous caller (401 / a
redirect to the login page), a caller who may not write to the job's team (403), an unknown job (404).
Then it installs `LimitedUploadHandler`, which stops the multipart parser as soon as the file passes
ARTIFACT_MAX_BYTES, so no more than the limit is ever written to a temporary file (issue #13).
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user
from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.http import HttpRequest
from rest_framework.exceptions import AuthenticationFailed

from jobs.access.permissions import can_read_team, can_write_team
from jobs.models import Job

# Multipart boundaries, part headers and the small `kind`/`rank` fields around the file.
MULTIPART_MARGIN_BYTES = 64 * 1024
UPLOAD_PATHS = (
    re.compile(r"^/jobs/(?P<external_id>[^/]+)/artifacts/$"),
    re.compile(r"^/api/v1/jobs/(?P<external_id>[^/]+)/artifacts/$"),
)
_REFUSED = "_upload_refused"


def upload_target(request: HttpRequest) -> str | None:
    """The job external id when `request` is an artifact upload (a POST to an upload URL), else None."""
    if request.method != "POST":
        return None
    for pattern in UPLOAD_PATHS:
        if found := pattern.match(request.path_info):
            return found.group("external_id")
    return None


def too_large_message(limit: int | None = None) -> str:
    """The refusal shown to the uploader, naming the limit and the setting."""
    limit = settings.ARTIFACT_MAX_BYTES if limit is None else limit
    return f"file is larger than the {limit / 1024**2:.0f} MiB limit (ARTIFACT_MAX_BYTES)"


class UploadRefusal(Exception):
    """Why an upload is refused before its body is read; `status` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def uploader(request: HttpRequest, *, api: bool) -> Any:
    """The authenticated user of an upload, from headers only (session cookie, or `Authorization: Token`
    on the API), or None. An invalid token is a refusal, not anonymity."""
    if api and request.META.get("HTTP_AUTHORIZATION"):
        from jobs.api.auth import ApiTokenAuthentication

        try:
            found = ApiTokenAuthentication().authenticate(request)  # type: ignore[arg-type]
        except AuthenticationFailed as exc:
            raise UploadRefusal(401, str(exc.detail)) from None
        if found is not None:
            return found[0]
    user = getattr(request, "_cached_user", None) or get_user(request)
    request._cached_user = user  # type: ignore[attr-defined]  # AuthenticationMiddleware reuses it
    return user if user.is_authenticated else None


def authorise_upload(request: HttpRequest, external_id: str, *, api: bool) -> tuple[Any, Job]:
    """Check the login, size and team write permission of an upload without reading its body.

    Returns (user, job); raises UploadRefusal (401, 413, 404 or 403, in that order)."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise UploadRefusal(400, "Content-Length is not a number") from None
    user = uploader(request, api=api)
    if user is None:
        raise UploadRefusal(401, "Authentication credentials were not provided.")
    if length > settings.ARTIFACT_MAX_BYTES + MULTIPART_MARGIN_BYTES:
        raise UploadRefusal(413, too_large_message())
    job = Job.objects.select_related("team").filter(external_id=external_id).first()
    if job is None or not can_read_team(user, job.team):  # another team's job is not found (read policy)
        raise UploadRefusal(404, f"no job {external_id!r}")
    if not can_write_team(user, job.team):
        raise UploadRefusal(403, "Only members of the job's team can upload artifacts.")
    return user, job


class LimitedUploadHandler(FileUploadHandler):
    """First upload handler of an upload request: passes chunks on to Django's handlers and stops the
    parser (StopUpload) once the files together pass ARTIFACT_MAX_BYTES; the request is marked refused."""

    def __init__(self, request: HttpRequest | None = None) -> None:
        super().__init__(request)
        self.limit = settings.ARTIFACT_MAX_BYTES
        self.received = 0

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes | None:
        self.received += len(raw_data)
        if self.received > self.limit:
            if self.request is not None:
                setattr(self.request, _REFUSED, too_large_message(self.limit))
            # The rest of the body is at most MULTIPART_MARGIN_BYTES (the middleware checked
            # Content-Length): read and drop it so the client receives the answer.
            raise StopUpload(connection_reset=False)
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None  # the next handler builds the UploadedFile


def install_upload_limit(request: HttpRequest) -> None:
    """Put LimitedUploadHandler first, if the body has not been parsed yet (idempotent)."""
    if hasattr(request, "_files") or any(
        isinstance(h, LimitedUploadHandler) for h in request.upload_handlers
    ):
        return
    request.upload_handlers = [LimitedUploadHandler(request), *request.upload_handlers]


def upload_refused(request: Any) -> str | None:
    """The size refusal LimitedUploadHandler recorded while the body was parsed, or None."""
    target = getattr(request, "_request", request)  # a DRF Request wraps the HttpRequest
    return getattr(target, _REFUSED, None)
