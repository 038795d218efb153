"""Limit/offset pagination that refuses malformed values with a 400 instead of guessing (issue #13)."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

MAX_OFFSET = 10**9  # far past any table here, far below Postgres' bigint OFFSET


def _bounded(params: Any, name: str, default: int, low: int, high: int) -> int:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise ValidationError({name: f"{name} must be a whole number from {low} to {high}"}) from None
    if not low <= value <= high:
        raise ValidationError({name: f"{name} must be from {low} to {high}, not {raw}"})
    return value


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """`?limit=` 1..1000 (default PAGE_SIZE) and `?offset=` 0..10^9; anything else is a 400 naming both."""

    max_limit = 1000

    def get_limit(self, request: Request) -> int:
        return _bounded(request.query_params, self.limit_query_param, self.default_limit or 100, 1, 1000)

    def get_offset(self, request: Request) -> int:
        return _bounded(request.query_params, self.offset_query_param, 0, 0, MAX_OFFSET)
