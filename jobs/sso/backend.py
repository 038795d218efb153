"""Single sign-on with OpenID Connect (mozilla-django-oidc): the authentication backend (the views
mounted under /oidc/ are in `jobs.sso.views`).

Off unless ``OIDC_ENABLED=true`` (``settings.SSO``, from efficiency.sso_config): the backend then declines
every login and the /oidc/ views answer 404, so local accounts work exactly as without SSO.

On each SSO login the backend
- verifies the ID token fully (signature against the provider's JWKS, issuer, audience = our client id,
  expiry, nonce; mozilla-django-oidc itself skips the audience and issuer checks, so we do them here);
- finds the account by the provider identity, (issuer, subject), once linked (jobs.models.SsoIdentity);
  at the identity's first login it links an existing account by verified email under jobs.sso.emails'
  rules (exact NFKC + casefold comparison in Python, no look-alike addresses, never a staff or superuser
  account, never one linked to another identity), or creates one named by ``OIDC_USERNAME_CLAIM``
  (default ``preferred_username``, falling back to the email); it never takes over a local account by
  user name; a linked user's email follows the provider only when verified and no other account has it;
- sets ``is_staff`` from ``OIDC_STAFF_GROUP`` (when configured; superusers keep staff);
- syncs team memberships from the groups claim (``efficiency.sso_config.teams_from_groups``).

Which memberships SSO manages, without a migration: a membership SSO created is marked by putting the
user in the auth group ``oidc-managed:<team slug>`` (shown on the user's admin page). At each login SSO
adds the memberships the groups grant, updates the role of those it manages, and deletes only those it
manages that the groups no longer grant. A membership an admin created (no marker) is never changed or
removed by SSO, even when the user is in or leaves the matching provider group.

A refused login (bad signature, wrong audience or issuer, expired token, wrong nonce, unverified email,
a user name held by another account, an administrator's email, the provider's own error) logs in nobody:
the login page shows why.
"""

from __future__ import annotations

import logging
from typing import Any

import jwt
import requests
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, User
from django.core.exceptions import SuspiciousOperation
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef
from django.http import HttpRequest
from django.utils import timezone
from django.utils.encoding import smart_str
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings

from efficiency.sso_config import SsoConfig, teams_from_groups
from jobs.models import Membership, SsoIdentity, Team
from jobs.sso.emails import Account, match_account, may_take_email

log = logging.getLogger(__name__)

MANAGED_GROUP_PREFIX = "oidc-managed:"
# A provider that sends thousands of groups is misconfigured (or hostile); the mapping reads this many.
MAX_GROUPS = 1000
# Clock skew tolerated on exp/iat/nbf between us and the provider.
LEEWAY_S = 60
# SsoIdentity's column widths (OIDC Core 2: sub is at most 255 ASCII characters).
SUBJECT_MAX = 255
ISSUER_MAX = 500

# Why this request's SSO attempt was refused, for the login page's message: the backend has the request,
# the callback view (which shows the message) does not see the backend's exceptions. Kept in the request's
# WSGI environ under a prefixed extension key (PEP 3333's convention), so it dies with the request.
REFUSAL_KEY = "efficiency.sso_refusal"


class SsoRefused(Exception):
    """An SSO login that must not succeed; the message is shown to the person trying to log in."""


def sso_config() -> SsoConfig:
    """The SSO configuration in force (``settings.SSO``)."""
    config: SsoConfig = settings.SSO
    return config


def oidc_setting(attr: str, *default: Any) -> Any:
    """mozilla-django-oidc's settings, derived from settings.SSO so there is one source of truth."""
    sso = sso_config()
    derived: dict[str, Any] = {
        "OIDC_RP_CLIENT_ID": sso.client_id,
        "OIDC_RP_CLIENT_SECRET": sso.client_secret,
        "OIDC_OP_AUTHORIZATION_ENDPOINT": sso.authorization_endpoint,
        "OIDC_OP_TOKEN_ENDPOINT": sso.token_endpoint,
        "OIDC_OP_USER_ENDPOINT": sso.userinfo_endpoint,
        "OIDC_OP_JWKS_ENDPOINT": sso.jwks_endpoint or None,
        "OIDC_RP_SIGN_ALGO": sso.sign_algorithm,
        "OIDC_RP_SCOPES": sso.scopes,
        "OIDC_TIMEOUT": sso.timeout_s,
        "OIDC_VERIFY_SSL": sso.verify_tls,
        "OIDC_USE_NONCE": True,
        "OIDC_USE_PKCE": True,
        "OIDC_CREATE_USER": True,
        # Kept in the (server-side) session only to send as id_token_hint at RP-initiated logout.
        "OIDC_STORE_ID_TOKEN": bool(sso.end_session_endpoint),
        "OIDC_STORE_ACCESS_TOKEN": False,
        "OIDC_AUTHENTICATION_CALLBACK_URL": "oidc_authentication_callback",
        "OIDC_ALLOW_UNSECURED_JWT": False,
    }
    if attr in derived:
        return derived[attr]
    return import_from_settings(attr, *default)


def _refuse(request: HttpRequest | None, reason: str) -> None:
    if request is not None:
        request.META[REFUSAL_KEY] = reason
    log.warning("SSO login refused: %s", reason)


def _groups(claims: dict[str, Any], claim: str) -> list[str]:
    value = claims.get(claim)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return []
    return [g for g in value[:MAX_GROUPS] if isinstance(g, str)]


def _verified(value: object) -> bool:
    # Some providers (e.g. AWS Cognito) send the boolean as a string.
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _accounts() -> list[Account]:
    """Every account with an email, as jobs.sso.emails' rules see it. The comparison key (NFKC + casefold)
    is computed in Python, so the database cannot narrow the rows; read at an identity's first login and
    when a linked user's email changes, not at every login."""
    linked = SsoIdentity.objects.filter(user=OuterRef("pk"))
    rows = (
        User.objects.exclude(email="")
        .annotate(linked=Exists(linked))
        .values_list("pk", "email", "is_staff", "is_superuser", "linked")
    )
    return [Account(pk, email, staff or superuser, has) for pk, email, staff, superuser, has in rows]


class SsoBackend(OIDCAuthenticationBackend):
    """OIDC authorization-code login that maps the provider's groups to teams; inert when SSO is off."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The project uses Django's own User (no AUTH_USER_MODEL swap); typed as such below.
        self.UserModel = User
        self.config = sso_config()
        if self.config.enabled:
            super().__init__(*args, **kwargs)

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> User | None:
        """The user of a valid callback (code + state), or None; a refusal's reason goes to the page."""
        if not self.config.enabled or request is None:
            return None
        try:
            user: User | None = super().authenticate(request, **kwargs)
        except SsoRefused as exc:
            _refuse(request, str(exc))
            return None
        except requests.RequestException as exc:
            # The response body may echo what we sent; the class and status say enough.
            status = getattr(exc.response, "status_code", None)
            _refuse(
                request,
                f"the provider could not be reached or refused the code ({type(exc).__name__}"
                + (f", HTTP {status})" if status else ")"),
            )
            return None
        except SuspiciousOperation as exc:
            _refuse(request, f"the provider's answer was not acceptable ({exc})")
            return None
        return user

    def verify_token(self, token: str, **kwargs: Any) -> dict[str, Any]:
        """The ID token's claims after checking signature, issuer, audience, expiry and nonce.

        The library also verifies a signed userinfo answer (application/jwt) here, without a nonce: that
        one is checked for signature, issuer and audience only (OIDC Core 5.3.2 requires no exp or nonce).
        """
        id_token = "nonce" in kwargs
        if not isinstance(token, str) or not token:
            raise SsoRefused("the provider returned no ID token")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.DecodeError:
            raise SsoRefused("the ID token is not a JWT") from None
        algorithm = header.get("alg")
        if algorithm != self.config.sign_algorithm:
            raise SsoRefused(
                f"the ID token is signed with {algorithm!r}, not the configured {self.config.sign_algorithm}"
            )
        if algorithm == "HS256":
            key: Any = self.config.client_secret
        else:
            key = self.retrieve_matching_jwk(token)
        try:
            payload: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience=self.config.client_id,
                issuer=self.config.issuer,
                leeway=LEEWAY_S,
                options={
                    "require": ["exp", "iat", "iss", "aud", "sub"] if id_token else ["iss", "aud", "sub"]
                },
            )
        except jwt.InvalidSignatureError:
            raise SsoRefused("the ID token's signature does not verify against the provider's keys") from None
        except jwt.ExpiredSignatureError:
            raise SsoRefused("the ID token has expired") from None
        except jwt.InvalidAudienceError:
            raise SsoRefused("the ID token was issued for another client (audience)") from None
        except jwt.InvalidIssuerError:
            raise SsoRefused("the ID token was issued by another provider (issuer)") from None
        except jwt.MissingRequiredClaimError as exc:
            raise SsoRefused(f"the ID token lacks the {exc.claim!r} claim") from None
        except jwt.InvalidTokenError as exc:
            raise SsoRefused(f"the ID token is invalid ({exc})") from None
        if id_token and (not kwargs["nonce"] or payload.get("nonce") != kwargs["nonce"]):
            raise SsoRefused("the ID token's nonce does not match this login (a replayed or mixed-up login)")
        return payload

    def retrieve_matching_jwk(self, token: str) -> Any:
        """The provider's signing key for this token (the library's lookup, with a clear refusal)."""
        try:
            return super().retrieve_matching_jwk(token)
        except (SuspiciousOperation, KeyError):
            raise SsoRefused("the ID token's key id is not among the provider's published keys") from None

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The ID token's claims completed by the userinfo endpoint's (which win where both have one)."""
        userinfo: dict[str, Any] = super().get_userinfo(access_token, id_token, payload)
        if smart_str(userinfo.get("sub")) != smart_str(payload.get("sub")):
            # OIDC Core 5.3.2: a userinfo answer for another subject must not be used.
            raise SsoRefused("the provider's userinfo is for another subject than the ID token")
        return {**payload, **userinfo}

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        """An email, verified unless OIDC_REQUIRE_VERIFIED_EMAIL=false, and a user name to use."""
        email = claims.get("email")
        if not isinstance(email, str) or "@" not in email:
            raise SsoRefused("the provider sent no email address (is the email scope granted?)")
        if self.config.require_verified_email and not _verified(claims.get("email_verified")):
            raise SsoRefused(f"the provider has not verified the email address {email}")
        return True

    def get_user(self, user_id: int) -> User | None:
        """The session's user, unless deactivated (the library's version skips Django's is_active check,
        which would keep a disabled SSO user's open sessions working)."""
        user: User | None = ModelBackend.get_user(self, user_id)
        return user

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> User:
        """The account of this provider identity (the ID token's verified iss and sub): its linked account
        once linked; at its first login an existing account by verified email (jobs.sso.emails) or a new
        account, and the link is stored. Replaces the library's email lookup (``email__iexact``)."""
        claims = self.get_userinfo(access_token, id_token, payload)
        self.verify_claims(claims)
        issuer, subject = smart_str(payload.get("iss")), smart_str(payload.get("sub"))
        if not subject or len(subject) > SUBJECT_MAX or len(issuer) > ISSUER_MAX:
            raise SsoRefused("the ID token's subject or issuer is empty or too long to be an identity")
        with transaction.atomic():
            identity = (
                SsoIdentity.objects.select_for_update()
                .select_related("user")
                .filter(issuer=issuer, subject=subject)
                .first()
            )
            if identity is not None:
                identity.last_login_at = timezone.now()
                identity.save(update_fields=["last_login_at"])
                return self.update_user(identity.user, claims)
            user, linked_by = self._first_login_account(claims, issuer, subject)
            try:
                with transaction.atomic():
                    SsoIdentity.objects.create(
                        issuer=issuer,
                        subject=subject,
                        user=user,
                        email_at_link=str(claims["email"])[:254],
                        linked_by=linked_by,
                        last_login_at=timezone.now(),
                    )
            except IntegrityError:
                # The same identity's first login ran twice at once; the other one linked it (and this
                # transaction's new account, if any, is rolled back with the refusal).
                raise SsoRefused(
                    "this sign-in was being linked by another login at the same time; try again"
                ) from None
            log.info("SSO linked %s at %s to user %s (%s)", subject, issuer, user.get_username(), linked_by)
            return user

    def _first_login_account(self, claims: dict[str, Any], issuer: str, subject: str) -> tuple[User, str]:
        """An identity's first login: the existing account its verified email links to, else a new one."""
        verified = _verified(claims.get("email_verified"))
        match = match_account(str(claims["email"]), verified, _accounts())
        if match.refusal is not None:
            # The identity in the message is what an admin enters to link it (SSO identities, admin site).
            raise SsoRefused(f"{match.refusal} (this sign-in: subject {subject!r} at {issuer})")
        if match.account is not None:
            user = self.UserModel.objects.get(pk=match.account.pk)
            return self.update_user(user, claims), "email"
        return self.create_user(claims), "first-login"

    def get_username(self, claims: dict[str, Any]) -> str:
        """The username claim (default preferred_username), or the email when it is absent."""
        value = claims.get(self.config.username_claim)
        name = value if isinstance(value, str) and value.strip() else claims["email"]
        return str(name).strip()[:150]

    def create_user(self, claims: dict[str, Any]) -> User:
        """A new account with no usable password (it logs in through SSO only), then synced."""
        username = self.get_username(claims)
        if self.UserModel.objects.filter(username__iexact=username).exists():
            # Taking over a local account by name would let anyone the provider calls "admin" be ours.
            raise SsoRefused(
                f"the user name {username!r} belongs to another account with a different email; an admin can "
                f"set that account's email to {claims['email']} to link it"
            )
        user = self.UserModel.objects.create_user(username, email=claims["email"])
        user.set_unusable_password()
        user.save()
        log.info("SSO created user %s", username)
        return self.update_user(user, claims)

    def update_user(self, user: User, claims: dict[str, Any]) -> User:
        """Names, email, staff flag and team memberships from the claims, on every login. The email only
        when verified and held by no other account (jobs.sso.emails.may_take_email)."""
        groups = _groups(claims, self.config.groups_claim)
        email = str(claims["email"])
        if email != user.email:
            if may_take_email(user.pk, email, _verified(claims.get("email_verified")), _accounts()):
                user.email = email
            else:
                log.warning(
                    "SSO kept %s's email: the provider's %r is unverified or another account's",
                    user.get_username(),
                    email,
                )
        for field, claim in (("first_name", "given_name"), ("last_name", "family_name")):
            value = claims.get(claim)
            if isinstance(value, str):
                setattr(user, field, value[:150])
        if self.config.staff_group:
            # Authoritative when configured; a superuser keeps staff, or the admin locks itself out.
            user.is_staff = self.config.staff_group in groups or user.is_superuser
        user.save()
        sync_memberships(user, teams_from_groups(groups, self.config), create_teams=self.config.create_teams)
        return user


@transaction.atomic
def sync_memberships(user: User, granted: dict[str, str], *, create_teams: bool) -> None:
    """Make the user's SSO-managed memberships equal to `granted` ({team slug: role}).

    Memberships without the ``oidc-managed:<slug>`` marker were made by an admin and are left alone.
    """
    managed = {
        g.name.removeprefix(MANAGED_GROUP_PREFIX): g
        for g in Group.objects.filter(user=user, name__startswith=MANAGED_GROUP_PREFIX)
    }
    existing = {m.team.slug: m for m in Membership.objects.filter(user=user).select_related("team")}
    for slug, role in granted.items():
        membership = existing.get(slug)
        if membership is not None:
            if slug in managed and membership.role != role:
                membership.role = role
                membership.save(update_fields=["role"])
            continue
        team = Team.objects.filter(slug=slug).first()
        if team is None:
            if not create_teams:
                log.info("SSO: group grants team %r, which does not exist (OIDC_CREATE_TEAMS=false)", slug)
                continue
            team = Team.objects.create(slug=slug, name=slug)
        Membership.objects.create(team=team, user=user, role=role)
        marker = managed.get(slug) or Group.objects.get_or_create(name=MANAGED_GROUP_PREFIX + slug)[0]
        marker.user_set.add(user)
        managed[slug] = marker
    for slug, marker in managed.items():
        if slug in granted:
            continue
        # Managed by SSO and no longer granted: the membership goes (if an admin has not removed it).
        Membership.objects.filter(user=user, team__slug=slug).delete()
        marker.user_set.remove(user)
