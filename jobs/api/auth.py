"""Token authentication for machines and the team-scoped write permission of the REST API (the rule
itself lives in jobs.access.permissions, shared with the pages)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from jobs.access.permissions import can_read_team, can_write_team, owning_team
from jobs.models import ApiToken


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Token <key>`; the key is looked up by its sha256, revoked tokens are refused."""

    keyword = "Token"

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header: expected 'Token <key>'.")
        try:
            key = header[1].decode()
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Token contains invalid characters.") from None
        token = (
            ApiToken.objects.select_related("user")
            .filter(key_hash=ApiToken.hash_key(key), revoked_at__isnull=True)
            .first()
        )
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        now = timezone.now()
        # Bounded write rate: recording every request's use would turn reads into writes.
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class TeamScopedWrite(permissions.BasePermission):
    """Reads follow the read policy (querysets are scoped with jobs.access.permissions, so another team's
    object
    is a 404 before this runs; the read check here is the backstop); only the owning team's members (or
    staff) may write. A token acts as its user: it reads and writes what that user may."""

    message = "You can only change objects that belong to one of your teams."

    def has_object_permission(self, request: Request, view: Any, obj: Any) -> bool:
        team = owning_team(obj)
        if not can_read_team(request.user, team):
            raise exceptions.NotFound()
        if request.method in permissions.SAFE_METHODS:
            return True
        return can_write_team(request.user, team)


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """Documents `Authorization: Token <key>` in the OpenAPI schema."""

    target_class = "jobs.api.auth.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <key>`; keys are created by an admin and shown once.",
        }
