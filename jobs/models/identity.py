"""Single sign-on identities: which provider account (issuer + subject) signs in as which local user."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class SsoIdentity(models.Model):
    """An OpenID Connect identity linked to a local account: the provider's `iss` and `sub` claims.

    OIDC Core 5.7: `sub` is unique and never reassigned within one issuer, and (iss, sub) is the only
    stable identifier of an end user; the email claim can change and may be shared or reassigned. Once an
    identity is linked, the login finds its user by (issuer, subject) alone (jobs.sso.backend). Created by
    the first SSO login of the identity, or by an admin in the admin site, which is the only way to link a
    staff or superuser account.
    """

    issuer = models.CharField(max_length=500, help_text="The provider's issuer URL (the ID token's iss).")
    subject = models.CharField(
        max_length=255, help_text="The provider's id of the person (the ID token's sub; 255 ASCII at most)."
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identities"
    )
    email_at_link = models.CharField(
        max_length=254, blank=True, help_text="The email the provider sent when the identity was linked."
    )
    linked_by = models.CharField(
        max_length=32,
        default="first-login",
        help_text="first-login (new account), email (an existing account's verified email) or admin.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_login_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "SSO identity"
        verbose_name_plural = "SSO identities"
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="sso_identity_unique_issuer_subject")
        ]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer} -> {self.user}"
