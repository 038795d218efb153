"""Login throttling (django-axes) as the first authentication backend."""

from __future__ import annotations

from typing import Any

from axes.backends import AxesStandaloneBackend
from django.http import HttpRequest


class LoginThrottleBackend(AxesStandaloneBackend):
    """django-axes' lockout check for every password login over HTTP (the login page, the admin).

    A call without a request is not a login over HTTP (the test client's `login()`, a management command):
    axes cannot tell who is asking there, so it is passed on to the next backend instead of refused with
    axes' "request required" error. Failures are counted by axes' `user_login_failed` handler.
    """

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> Any:
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)
