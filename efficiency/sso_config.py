"""OpenID Connect (SSO) configuration from environment variables, and the group-to-team mapping rule.

Pure: no Django imports, so settings.py can call :func:`load_sso_config` and the mapping can be unit
tested without a database. Everything is off unless ``OIDC_ENABLED=true``; once enabled, a missing or
malformed variable stops the process at start-up with a message naming it (``EnvError``), rather than
serving a login button that can only fail.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from efficiency.env import EnvError, env_bool, env_choice, env_float, env_str, env_url

# The two roles of jobs.models.Membership.Role, lowest first (a user in two groups mapping to one team
# gets the higher one). Repeated here so this module stays free of Django imports.
ROLES = ("member", "lead")
# Algorithms mozilla-django-oidc verifies: RS*/ES* against the provider's JWKS, HS256 with the client
# secret (only for providers that sign that way; the key is then shared with every client of the realm).
SIGN_ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "HS256")
_SLUG = re.compile(r"^[-a-zA-Z0-9_]{1,64}$")


@dataclass(frozen=True)
class TeamGrant:
    """A team membership a group grants: the team's slug and the role in it."""

    slug: str
    role: str


@dataclass(frozen=True)
class SsoConfig:
    """Everything the OIDC login needs; ``enabled=False`` (the default) leaves the rest empty."""

    enabled: bool = False
    provider_name: str = "SSO"
    issuer: str = ""
    authorization_endpoint: str = ""
    token_endpoint: str = ""
    userinfo_endpoint: str = ""
    jwks_endpoint: str = ""
    # RP-initiated logout: where /logout/ sends an SSO user after the local logout (empty: local only).
    end_session_endpoint: str = ""
    client_id: str = ""
    # Never printed: repr=False keeps it out of tracebacks and debug pages that show the config object.
    client_secret: str = field(default="", repr=False)
    scopes: str = "openid email profile"
    sign_algorithm: str = "RS256"
    username_claim: str = "preferred_username"
    groups_claim: str = "groups"
    team_map: Mapping[str, TeamGrant] = field(default_factory=dict)
    group_prefix: str = ""
    staff_group: str = ""
    create_teams: bool = False
    require_verified_email: bool = True
    timeout_s: float = 10.0
    verify_tls: bool = True


def parse_team_map(name: str, value: str) -> dict[str, TeamGrant]:
    """``group=slug[:role],group2=slug2[:role]`` -> {group: TeamGrant}; role defaults to member.

    A group may appear once; several groups may name one team (the higher role wins at login).
    """
    mapping: dict[str, TeamGrant] = {}
    for raw in value.split(","):
        item = raw.strip()
        if not item:
            continue
        group, sep, target = item.rpartition("=")
        group, target = group.strip(), target.strip()
        if not sep or not group or not target:
            raise EnvError(f"{name}: {item!r} is not group=team-slug[:role]")
        slug, _, role = target.partition(":")
        slug, role = slug.strip(), (role.strip() or "member")
        if not _SLUG.match(slug):
            raise EnvError(f"{name}: {slug!r} (for group {group!r}) is not a team slug")
        if role not in ROLES:
            raise EnvError(f"{name}: role {role!r} (for group {group!r}) must be one of: {', '.join(ROLES)}")
        if group in mapping:
            raise EnvError(f"{name}: group {group!r} is mapped twice")
        mapping[group] = TeamGrant(slug, role)
    return mapping


def teams_from_groups(groups: Iterable[str], config: SsoConfig) -> dict[str, str]:
    """The teams a user's groups grant: {team slug: role}.

    A group listed in ``OIDC_TEAM_MAP`` grants its team and role; otherwise a group starting with
    ``OIDC_GROUP_PREFIX`` grants membership (role member) of the team named by the rest of it
    (``team-llm`` -> ``llm``), when that rest is a valid slug. Other groups grant nothing. When several
    groups grant one team, the higher role wins.
    """
    granted: dict[str, str] = {}
    for group in groups:
        grant = config.team_map.get(group)
        if grant is None and config.group_prefix and group.startswith(config.group_prefix):
            slug = group[len(config.group_prefix) :]
            grant = TeamGrant(slug, "member") if _SLUG.match(slug) else None
        if grant is None:
            continue
        current = granted.get(grant.slug)
        if current is None or ROLES.index(grant.role) > ROLES.index(current):
            granted[grant.slug] = grant.role
    return granted


def _client_secret(env: Mapping[str, str] | None) -> str:
    inline = env_str("OIDC_CLIENT_SECRET", "", env=env)
    path = env_str("OIDC_CLIENT_SECRET_FILE", "", env=env)
    if inline and path:
        raise EnvError("set OIDC_CLIENT_SECRET or OIDC_CLIENT_SECRET_FILE, not both")
    if not path:
        return inline
    try:
        secret = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        # The path is named, the content never is.
        raise EnvError(f"OIDC_CLIENT_SECRET_FILE={path!r} cannot be read: {exc.strerror}") from None
    if not secret:
        raise EnvError(f"OIDC_CLIENT_SECRET_FILE={path!r} is empty")
    return secret


def load_sso_config(env: Mapping[str, str] | None = None) -> SsoConfig:
    """The SSO configuration from the environment (``env`` for tests); raises EnvError when incomplete."""
    if not env_bool("OIDC_ENABLED", False, env=env):
        return SsoConfig()
    missing = [
        name
        for name in (
            "OIDC_ISSUER",
            "OIDC_AUTHORIZATION_ENDPOINT",
            "OIDC_TOKEN_ENDPOINT",
            "OIDC_USERINFO_ENDPOINT",
            "OIDC_CLIENT_ID",
        )
        if not env_str(name, "", env=env)
    ]
    algorithm = env_choice("OIDC_SIGN_ALGORITHM", "RS256", SIGN_ALGORITHMS, env=env)
    if algorithm != "HS256" and not env_str("OIDC_JWKS_ENDPOINT", "", env=env):
        missing.append("OIDC_JWKS_ENDPOINT")
    secret = _client_secret(env)
    if not secret:
        missing.append("OIDC_CLIENT_SECRET (or OIDC_CLIENT_SECRET_FILE)")
    if missing:
        raise EnvError("OIDC_ENABLED=true but these are not set: " + ", ".join(missing))

    def url(name: str) -> str:
        return env_url(name, "", schemes=("https", "http"), env=env) if env_str(name, "", env=env) else ""

    scopes = env_str("OIDC_SCOPES", "openid email profile", env=env)
    if "openid" not in scopes.split():
        raise EnvError(f"OIDC_SCOPES={scopes!r} must include openid")
    team_map = parse_team_map("OIDC_TEAM_MAP", env_str("OIDC_TEAM_MAP", "", env=env))
    prefix = env_str("OIDC_GROUP_PREFIX", "", env=env)
    return SsoConfig(
        enabled=True,
        provider_name=env_str("OIDC_PROVIDER_NAME", "SSO", env=env),
        issuer=url("OIDC_ISSUER"),
        authorization_endpoint=url("OIDC_AUTHORIZATION_ENDPOINT"),
        token_endpoint=url("OIDC_TOKEN_ENDPOINT"),
        userinfo_endpoint=url("OIDC_USERINFO_ENDPOINT"),
        jwks_endpoint=url("OIDC_JWKS_ENDPOINT"),
        end_session_endpoint=url("OIDC_END_SESSION_ENDPOINT"),
        client_id=env_str("OIDC_CLIENT_ID", env=env),
        client_secret=secret,
        scopes=scopes,
        sign_algorithm=algorithm,
        username_claim=env_str("OIDC_USERNAME_CLAIM", "preferred_username", env=env),
        groups_claim=env_str("OIDC_GROUPS_CLAIM", "groups", env=env),
        team_map=team_map,
        group_prefix=prefix,
        staff_group=env_str("OIDC_STAFF_GROUP", "", env=env),
        create_teams=env_bool("OIDC_CREATE_TEAMS", False, env=env),
        require_verified_email=env_bool("OIDC_REQUIRE_VERIFIED_EMAIL", True, env=env),
        timeout_s=env_float("OIDC_TIMEOUT_S", 10.0, min_value=0.5, max_value=120.0, env=env),
        verify_tls=env_bool("OIDC_VERIFY_TLS", True, env=env),
    )
