"""The single sign-on views mounted under /oidc/ (``include("jobs.sso.views")``): the login start and the
provider's callback (both 404 while SSO is off), the logout that also ends the provider's session, and
django-axes' exemption of the callback. The login itself is `backend.SsoBackend`'s."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.views import LogoutView
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.urls import path, reverse
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from jobs.sso.backend import REFUSAL_KEY, oidc_setting, sso_config


def not_a_password_login(request: HttpRequest, credentials: dict[str, Any] | None = None) -> bool:
    """django-axes' AXES_WHITELIST_CALLABLE: True for the SSO callback, which axes then neither counts nor
    locks. It guesses no password (the provider throttles its own logins), and counting its failures per
    address would let one client behind a shared NAT lock everyone there out of SSO."""
    return request.path_info == reverse("oidc_authentication_callback")


def _enabled_or_404() -> None:
    if not sso_config().enabled:
        raise Http404("Single sign-on is not enabled")


class SsoLoginView(OIDCAuthenticationRequestView):
    """Starts the login: redirects to the provider's authorization endpoint (state, nonce, PKCE)."""

    get_settings = staticmethod(oidc_setting)

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        """404 while SSO is off."""
        _enabled_or_404()
        response: HttpResponseBase = super().dispatch(request, *args, **kwargs)
        return response


class SsoCallbackView(OIDCAuthenticationCallbackView):
    """The provider redirects here with a code; logs the user in or shows on the login page why not."""

    get_settings = staticmethod(oidc_setting)

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        """404 while SSO is off."""
        _enabled_or_404()
        response: HttpResponseBase = super().dispatch(request, *args, **kwargs)
        return response

    def get(self, request: HttpRequest) -> HttpResponseBase:
        """The library's callback; an unknown state (a replayed or foreign callback) is a refusal too."""
        if request.GET.get("error"):
            description = request.GET.get("error_description", "")[:200]
            request.META[REFUSAL_KEY] = (
                f"the provider answered {request.GET['error'][:64]!r} {description}".strip()
            )
        elif "code" in request.GET and "state" in request.GET and "oidc_states" not in request.session:
            request.META[REFUSAL_KEY] = "this login was not started in this browser session, or it expired"
        try:
            response: HttpResponseBase = super().get(request)
        except SuspiciousOperation:
            request.META[REFUSAL_KEY] = "this login's state is unknown (already used, or not started here)"
            return self.login_failure()
        return response

    def login_failure(self) -> HttpResponseBase:
        """Back to the login page with the reason (local login still works there)."""
        reason = self.request.META.pop(REFUSAL_KEY, None)
        if reason is None and getattr(self, "user", None) is not None and not self.user.is_active:
            reason = "this account is disabled"
        name = sso_config().provider_name
        messages.error(
            self.request, f"Sign-in with {name} failed: {reason or 'the login was not completed'}."
        )
        return HttpResponseRedirect(reverse("login"))


class LocalAndSsoLogoutView(LogoutView):
    """Ends the local session; after an SSO login with OIDC_END_SESSION_ENDPOINT set, also the provider's.

    The provider is told through RP-initiated logout (id_token_hint, post_logout_redirect_uri = our login
    page, which must be registered with the provider). Without the endpoint only the local session ends
    and a new "Sign in with ..." may pass straight through while the provider's session lasts.
    """

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        """Local logout, then the provider's end-session endpoint when there is one to tell."""
        id_token = request.session.get("oidc_id_token")
        response: HttpResponse = super().post(request, *args, **kwargs)
        config = sso_config()
        if config.enabled and config.end_session_endpoint and isinstance(id_token, str):
            query = urlencode(
                {
                    "id_token_hint": id_token,
                    "client_id": config.client_id,
                    "post_logout_redirect_uri": request.build_absolute_uri(reverse("login")),
                }
            )
            return HttpResponseRedirect(f"{config.end_session_endpoint}?{query}")
        return response


urlpatterns = [
    path("authenticate/", login_not_required(SsoLoginView.as_view()), name="oidc_authentication_init"),
    path("callback/", login_not_required(SsoCallbackView.as_view()), name="oidc_authentication_callback"),
]
