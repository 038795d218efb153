"""`{% sso_provider %}`: the name on the login page's "Sign in with ..." button, empty while SSO is off."""

from __future__ import annotations

from django import template

from jobs.sso.backend import sso_config

register = template.Library()


@register.simple_tag
def sso_provider() -> str:
    """The configured provider's display name (OIDC_PROVIDER_NAME) when SSO is enabled, else ""."""
    config = sso_config()
    return config.provider_name if config.enabled else ""
