"""OIDC login (jobs.sso.backend) against a real local provider (tests/oidc_provider.py), driven end to end:
Django's test client for our side, requests for the browser's hop through the provider."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from efficiency.env import EnvError
from efficiency.sso_config import SsoConfig, TeamGrant, load_sso_config, parse_team_map, teams_from_groups
from jobs.models import Membership, SsoIdentity
from tests.oidc_provider import OidcProvider

STAFF_GROUP = "efficiency-admins"


@pytest.fixture(scope="module")
def provider():
    """One provider (RSA key generation is the slow part) for the module; each test resets its user."""
    served = OidcProvider().start()
    yield served
    served.stop()


@pytest.fixture
def sso(provider, settings):
    """SSO enabled against the local provider: explicit map, prefix rule, staff group, RP logout."""
    provider.tamper = None
    provider.userinfo_overrides = {}
    provider.userinfo_as_jwt = False
    provider.user = _claims(groups=[])
    endpoints = provider.endpoints()
    settings.SSO = SsoConfig(
        enabled=True,
        provider_name="TestIdP",
        issuer=endpoints["issuer"],
        authorization_endpoint=endpoints["authorization_endpoint"],
        token_endpoint=endpoints["token_endpoint"],
        userinfo_endpoint=endpoints["userinfo_endpoint"],
        jwks_endpoint=endpoints["jwks_uri"],
        end_session_endpoint=endpoints["end_session_endpoint"],
        client_id=provider.client_id,
        client_secret=provider.client_secret,
        team_map={"ml-infra": TeamGrant("infra", "lead"), "llm-team": TeamGrant("llm", "member")},
        group_prefix="team-",
        staff_group=STAFF_GROUP,
        timeout_s=5.0,
    )
    return settings.SSO


def _claims(
    groups: list[str], username: str = "alice", email: str = "alice@corp.example", verified: bool = True
) -> dict[str, object]:
    return {
        "sub": f"sub-{username}",
        "preferred_username": username,
        "email": email,
        "email_verified": verified,
        "given_name": "Alice",
        "family_name": "Liddell",
        "groups": groups,
    }


def _sso_login(client, start: str = "/oidc/authenticate/"):
    """Login button -> provider /authorize -> our callback; the callback's response."""
    response = client.get(start)
    assert response.status_code == 302
    assert response["Location"].startswith(client_provider_prefix(response["Location"]))
    at_provider = requests.get(response["Location"], allow_redirects=False, timeout=5)
    assert at_provider.status_code == 302, at_provider.text
    back = urlsplit(at_provider.headers["Location"])
    assert (back.netloc, back.path) == ("testserver", "/oidc/callback/")
    return client.get(f"{back.path}?{back.query}")


def client_provider_prefix(location: str) -> str:
    """The provider's authorization endpoint (what the login redirect must point at)."""
    parts = urlsplit(location)
    assert parts.path == "/authorize", location
    return f"{parts.scheme}://{parts.netloc}/authorize?"


def _teams(user) -> dict[str, str]:
    return {m.team.slug: m.role for m in Membership.objects.filter(user=user).select_related("team")}


def _logged_in_user(client):
    user_id = client.session.get("_auth_user_id")
    return None if user_id is None else get_user_model().objects.get(pk=user_id)


@pytest.mark.django_db
def test_sso_login_creates_the_user_with_teams_and_staff_from_the_groups_claim(
    client, provider, sso, make_team
):
    for slug in ("infra", "llm", "gpu"):
        make_team(slug)
    provider.user = _claims(groups=["ml-infra", "team-gpu", STAFF_GROUP, "unrelated", "team-nonexistent"])

    response = _sso_login(client)

    assert response.status_code == 302 and response["Location"] == "/"
    user = _logged_in_user(client)
    assert user is not None and user.username == "alice"
    assert (user.email, user.first_name, user.last_name) == ("alice@corp.example", "Alice", "Liddell")
    assert user.is_staff and not user.is_superuser
    assert not user.has_usable_password()
    # ml-infra maps to infra as lead; team-gpu by the prefix rule as member; no team is created for
    # team-nonexistent (OIDC_CREATE_TEAMS is off); llm-team was not in the claim.
    assert _teams(user) == {"infra": "lead", "gpu": "member"}
    # The authorization-code exchange used PKCE and our client credentials.
    assert provider.last_token_request["code_verifier"]
    assert provider.last_token_request["client_id"] == provider.client_id
    assert client.get("/").status_code == 200


@pytest.mark.django_db
def test_a_later_login_with_changed_groups_updates_only_the_memberships_sso_made(
    client, provider, sso, make_team
):
    infra, llm, ops = make_team("infra"), make_team("llm"), make_team("ops")
    provider.user = _claims(groups=["ml-infra", "llm-team", STAFF_GROUP])
    _sso_login(client)
    user = _logged_in_user(client)
    assert _teams(user) == {"infra": "lead", "llm": "member"}
    # An admin adds alice to ops by hand, as lead.
    Membership.objects.create(team=ops, user=user, role="lead")

    client.logout()
    # She left ml-infra and the staff group, and joined team-ops (which would make her a member).
    provider.user = _claims(groups=["llm-team", "team-ops"])
    _sso_login(client)
    user.refresh_from_db()
    assert _logged_in_user(client) == user
    # infra (made by SSO) goes; llm stays; ops (made by an admin) keeps the admin's role.
    assert _teams(user) == {"llm": "member", "ops": "lead"}
    assert not user.is_staff

    client.logout()
    provider.user = _claims(groups=[])
    _sso_login(client)
    # No group at all: SSO's llm goes, the admin's ops stays.
    assert _teams(user) == {"ops": "lead"}
    assert not Group.objects.filter(user=user).exists()
    assert {infra.slug, llm.slug} == {"infra", "llm"}


@pytest.mark.django_db
def test_a_role_change_in_the_mapping_updates_the_sso_membership(client, provider, sso, make_team, settings):
    make_team("llm")
    provider.user = _claims(groups=["llm-team"])
    _sso_login(client)
    user = _logged_in_user(client)
    assert _teams(user) == {"llm": "member"}
    settings.SSO = replace(sso, team_map={"llm-team": TeamGrant("llm", "lead")})
    client.logout()
    _sso_login(client)
    assert _teams(user) == {"llm": "lead"}


@pytest.mark.django_db
def test_missing_teams_are_created_when_oidc_create_teams_is_on(client, provider, sso, settings):
    settings.SSO = replace(sso, create_teams=True)
    provider.user = _claims(groups=["team-newteam"])
    _sso_login(client)
    assert _teams(_logged_in_user(client)) == {"newteam": "member"}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        ("bad_signature", "signature does not verify"),
        ("wrong_audience", "issued for another client (audience)"),
        ("wrong_issuer", "issued by another provider (issuer)"),
        ("expired", "has expired"),
        ("bad_nonce", "nonce does not match"),
        ("unknown_kid", "key id is not among the provider's published keys"),
    ],
)
def test_a_bad_id_token_logs_nobody_in_and_the_login_page_says_why(client, provider, sso, tamper, reason):
    provider.user = _claims(groups=["llm-team"])
    provider.tamper = tamper

    response = _sso_login(client)

    assert response.status_code == 302 and response["Location"] == "/login/"
    assert _logged_in_user(client) is None
    assert not get_user_model().objects.filter(username="alice").exists()
    page = client.get("/login/").content.decode()
    assert "Sign-in with TestIdP failed" in page
    assert reason in page.replace("&#x27;", "'")


@pytest.mark.django_db
def test_groups_in_the_id_token_alone_are_used(client, provider, sso, make_team):
    make_team("llm")
    provider.user = _claims(groups=["llm-team"])
    provider.userinfo_overrides = {"groups": None}
    _sso_login(client)
    assert _teams(_logged_in_user(client)) == {"llm": "member"}


@pytest.mark.django_db
def test_a_signed_userinfo_answer_is_verified_and_used(client, provider, sso, make_team):
    make_team("llm")
    # The group is only in the userinfo answer, so the team proves that answer was verified and read.
    provider.user = _claims(groups=[])
    provider.userinfo_overrides = {"groups": ["llm-team"]}
    provider.userinfo_as_jwt = True
    _sso_login(client)
    assert _teams(_logged_in_user(client)) == {"llm": "member"}


@pytest.mark.django_db
def test_userinfo_for_another_subject_is_refused(client, provider, sso):
    provider.userinfo_overrides = {"sub": "someone-else"}
    _sso_login(client)
    assert _logged_in_user(client) is None
    assert "userinfo is for another subject" in client.get("/login/").content.decode()


def test_the_service_does_not_start_with_sso_enabled_but_incomplete():
    env = {**os.environ, "OIDC_ENABLED": "true", "OIDC_ISSUER": "https://idp.example"}
    env.pop("OIDC_CLIENT_ID", None)
    result = subprocess.run(
        [sys.executable, "-c", "import efficiency.settings"],
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "OIDC_ENABLED=true but these are not set" in result.stderr
    assert "OIDC_CLIENT_ID" in result.stderr and "OIDC_TOKEN_ENDPOINT" in result.stderr


@pytest.mark.django_db
def test_an_unverified_email_is_refused(client, provider, sso):
    provider.user = _claims(groups=[], verified=False)
    _sso_login(client)
    assert _logged_in_user(client) is None
    assert "has not verified the email address alice@corp.example" in client.get("/login/").content.decode()


@pytest.mark.django_db
def test_a_local_account_with_the_same_user_name_is_not_taken_over(client, provider, sso, make_user):
    make_user("alice")  # alice@example.com, a different address from the provider's
    provider.user = _claims(groups=[STAFF_GROUP])
    _sso_login(client)
    assert _logged_in_user(client) is None
    assert get_user_model().objects.get(username="alice").is_staff is False
    page = client.get("/login/").content.decode().replace("&#x27;", "'")
    assert "the user name 'alice' belongs to another account" in page


@pytest.mark.django_db
def test_a_local_account_with_the_verified_email_is_linked_and_keeps_its_password(
    client, provider, sso, make_user, make_team
):
    make_team("llm")
    local = make_user("asmith", password="pw-correct-horse")  # email asmith@example.com
    provider.user = _claims(groups=["llm-team"], username="alice.smith", email="ASmith@example.com")
    _sso_login(client)
    assert _logged_in_user(client) == local
    local.refresh_from_db()
    assert local.username == "asmith" and local.check_password("pw-correct-horse")
    assert _teams(local) == {"llm": "member"}


@pytest.mark.django_db
def test_the_login_next_page_is_kept_through_the_provider(client, provider, sso):
    response = _sso_login(client, start="/oidc/authenticate/?next=/teams/")
    assert response["Location"] == "/teams/"
    # A foreign next is dropped (open-redirect guard) and the default page is used.
    client.logout()
    response = _sso_login(client, start="/oidc/authenticate/?next=https://evil.example/")
    assert response["Location"] == "/"


@pytest.mark.django_db
def test_a_replayed_callback_is_refused(client, provider, sso):
    response = client.get("/oidc/authenticate/")
    at_provider = requests.get(response["Location"], allow_redirects=False, timeout=5)
    callback = urlsplit(at_provider.headers["Location"])
    replay = f"{callback.path}?{callback.query}"
    assert client.get(replay)["Location"] == "/"
    client.logout()
    # The same code and state again: in a session that started another login (its state is not this one)...
    client.get("/oidc/authenticate/")
    assert client.get(replay)["Location"] == "/login/"
    assert _logged_in_user(client) is None
    assert "state is unknown (already used" in client.get("/login/").content.decode().replace("&#x27;", "'")
    # ...and in a fresh session that started none.
    client.logout()
    assert client.get(replay)["Location"] == "/login/"
    assert _logged_in_user(client) is None
    assert "not started in this browser session" in client.get("/login/").content.decode()


@pytest.mark.django_db
def test_a_deactivated_user_can_neither_log_in_nor_keep_a_session(client, provider, sso):
    _sso_login(client)
    user = _logged_in_user(client)
    assert client.get("/").status_code == 200
    user.is_active = False
    user.save()
    # The open session ends at the next request (Django's is_active check, kept by SsoBackend.get_user).
    assert client.get("/")["Location"].startswith("/login/")
    assert _sso_login(client)["Location"] == "/login/"
    assert client.get("/")["Location"].startswith("/login/")
    assert "this account is disabled" in client.get("/login/").content.decode()


@pytest.mark.django_db
def test_a_wrong_client_secret_is_refused_without_showing_it(client, provider, sso, settings, caplog):
    settings.SSO = replace(sso, client_secret="not-the-secret")
    _sso_login(client)
    assert _logged_in_user(client) is None
    page = client.get("/login/").content.decode()
    assert "refused the code (HTTPError, HTTP 401)" in page
    assert "not-the-secret" not in page and "not-the-secret" not in caplog.text


@pytest.mark.django_db
def test_an_unreachable_provider_is_a_clear_refusal_and_local_login_still_works(
    client, provider, sso, settings, make_user
):
    # Nothing listens on port 9 of loopback (discard): the code exchange fails to connect.
    settings.SSO = replace(sso, token_endpoint="http://127.0.0.1:9/token")
    _sso_login(client)
    assert _logged_in_user(client) is None
    assert "could not be reached" in client.get("/login/").content.decode()
    make_user("bob")
    assert client.post("/login/", {"username": "bob", "password": "pw-correct-horse"}).status_code == 302


@pytest.mark.django_db
def test_the_providers_error_answer_is_shown(client, sso):
    client.get("/oidc/authenticate/")
    state = next(iter(client.session["oidc_states"]))
    response = client.get(f"/oidc/callback/?error=access_denied&error_description=not+allowed&state={state}")
    assert response["Location"] == "/login/"
    page = client.get("/login/").content.decode()
    assert "access_denied" in page and "not allowed" in page


@pytest.mark.django_db
def test_logout_ends_the_local_session_and_the_providers(client, provider, sso):
    _sso_login(client)
    id_token = client.session["oidc_id_token"]
    response = client.post("/logout/")
    assert _logged_in_user(client) is None
    location = urlsplit(response["Location"])
    assert (
        f"{location.scheme}://{location.netloc}{location.path}"
        == provider.endpoints()["end_session_endpoint"]
    )
    query = parse_qs(location.query)
    assert query["id_token_hint"] == [id_token]
    assert query["post_logout_redirect_uri"] == ["http://testserver/login/"]
    assert requests.get(response["Location"], timeout=5).status_code == 200


@pytest.mark.django_db
def test_logout_of_a_local_login_stays_local_even_with_sso_on(client, sso, make_user):
    make_user("bob")
    assert client.post("/login/", {"username": "bob", "password": "pw-correct-horse"}).status_code == 302
    response = client.post("/logout/")
    assert response["Location"] == "/login/"
    assert _logged_in_user(client) is None


@pytest.mark.django_db
def test_the_login_page_offers_the_provider_and_the_password_form(client, sso):
    page = client.get("/login/?next=/teams/").content.decode()
    assert "Sign in with TestIdP" in page
    assert 'href="/oidc/authenticate/?next=/teams/"' in page
    assert 'name="password"' in page


@pytest.mark.django_db
def test_with_sso_off_the_oidc_urls_404_and_local_login_works(client, make_user):
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/?code=x&state=y").status_code == 404
    page = client.get("/login/").content.decode()
    assert "Sign in with" not in page
    make_user("bob")
    assert client.post("/login/", {"username": "bob", "password": "pw-correct-horse"}).status_code == 302
    assert client.get("/").status_code == 200


@pytest.mark.django_db
def test_local_password_login_still_works_with_sso_on(client, sso, make_user):
    make_user("bob")
    assert client.post("/login/", {"username": "bob", "password": "pw-correct-horse"}).status_code == 302
    assert client.get("/").status_code == 200


def test_the_sso_backend_is_installed_beside_the_local_one(settings):
    assert "django.contrib.auth.backends.ModelBackend" in settings.AUTHENTICATION_BACKENDS
    assert "jobs.sso.backend.SsoBackend" in settings.AUTHENTICATION_BACKENDS


# -- configuration (pure) -------------------------------------------------------------------------------

_COMPLETE = {
    "OIDC_ENABLED": "true",
    "OIDC_ISSUER": "https://idp.example/realms/corp",
    "OIDC_AUTHORIZATION_ENDPOINT": "https://idp.example/realms/corp/protocol/openid-connect/auth",
    "OIDC_TOKEN_ENDPOINT": "https://idp.example/realms/corp/protocol/openid-connect/token",
    "OIDC_USERINFO_ENDPOINT": "https://idp.example/realms/corp/protocol/openid-connect/userinfo",
    "OIDC_JWKS_ENDPOINT": "https://idp.example/realms/corp/protocol/openid-connect/certs",
    "OIDC_CLIENT_ID": "efficiency",
    "OIDC_CLIENT_SECRET": "s3cret-value",
    "OIDC_TEAM_MAP": "ml-infra=infra:lead, llm-team=llm",
    "OIDC_GROUP_PREFIX": "team-",
    "OIDC_STAFF_GROUP": "efficiency-admins",
}


def test_sso_is_off_by_default():
    assert load_sso_config({}).enabled is False


def test_a_complete_configuration_loads_and_never_shows_the_secret():
    config = load_sso_config(_COMPLETE)
    assert config.enabled and config.sign_algorithm == "RS256" and config.groups_claim == "groups"
    assert config.team_map == {"ml-infra": TeamGrant("infra", "lead"), "llm-team": TeamGrant("llm", "member")}
    assert "s3cret-value" not in repr(config)


def test_enabled_but_incomplete_fails_naming_every_missing_variable():
    env = {k: v for k, v in _COMPLETE.items() if k not in ("OIDC_TOKEN_ENDPOINT", "OIDC_JWKS_ENDPOINT")}
    env.pop("OIDC_CLIENT_SECRET")
    with pytest.raises(EnvError) as error:
        load_sso_config(env)
    message = str(error.value)
    for name in ("OIDC_TOKEN_ENDPOINT", "OIDC_JWKS_ENDPOINT", "OIDC_CLIENT_SECRET"):
        assert name in message


def test_hs256_needs_no_jwks_endpoint():
    env = {k: v for k, v in _COMPLETE.items() if k != "OIDC_JWKS_ENDPOINT"}
    assert load_sso_config({**env, "OIDC_SIGN_ALGORITHM": "HS256"}).jwks_endpoint == ""


def test_the_client_secret_can_come_from_a_file(tmp_path: Path):
    secret_file = tmp_path / "secret"
    secret_file.write_text("from-a-file\n")
    env = {k: v for k, v in _COMPLETE.items() if k != "OIDC_CLIENT_SECRET"}
    assert (
        load_sso_config({**env, "OIDC_CLIENT_SECRET_FILE": str(secret_file)}).client_secret == "from-a-file"
    )
    with pytest.raises(EnvError, match="not both"):
        load_sso_config({**_COMPLETE, "OIDC_CLIENT_SECRET_FILE": str(secret_file)})
    with pytest.raises(EnvError, match="cannot be read"):
        load_sso_config({**env, "OIDC_CLIENT_SECRET_FILE": str(tmp_path / "absent")})


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("ml-infra", "is not group=team-slug"),
        ("ml-infra=infra:admin", "must be one of: member, lead"),
        ("ml-infra=not a slug", "is not a team slug"),
        ("a=x,a=y", "mapped twice"),
    ],
)
def test_a_malformed_team_map_fails_loudly(value, fragment):
    with pytest.raises(EnvError, match=fragment):
        parse_team_map("OIDC_TEAM_MAP", value)


@pytest.mark.parametrize(
    ("name", "value"),
    [("OIDC_SIGN_ALGORITHM", "none"), ("OIDC_SCOPES", "email profile"), ("OIDC_ISSUER", "idp.example")],
)
def test_bad_values_fail_loudly(name, value):
    with pytest.raises(EnvError, match=name):
        load_sso_config({**_COMPLETE, name: value})


def test_groups_map_to_teams_by_the_explicit_map_then_the_prefix_with_the_higher_role_winning():
    config = SsoConfig(
        enabled=True,
        team_map={"ml-infra": TeamGrant("infra", "lead"), "infra-readers": TeamGrant("infra", "member")},
        group_prefix="team-",
    )
    groups = ["infra-readers", "ml-infra", "team-llm", "team-", "team-bad slug", "other"]
    # infra: member and lead -> lead; team-llm -> llm member; "team-" and "team-bad slug" are no slugs.
    assert teams_from_groups(groups, config) == {"infra": "lead", "llm": "member"}
    # The explicit map wins over the prefix for the same group.
    config = replace(config, team_map={"team-llm": TeamGrant("llm", "lead")})
    assert teams_from_groups(["team-llm"], config) == {"llm": "lead"}


@pytest.mark.django_db
def test_failed_sso_logins_lock_out_neither_sso_nor_password_logins(
    client, provider, sso, make_user, settings
):
    # The callback is no password guess (the provider throttles its own logins); counting its failures
    # per address would let anyone behind a shared NAT lock everybody there out of SSO.
    failure_limit = getattr(settings, "AXES_FAILURE_LIMIT", 5)
    for _ in range(failure_limit + 1):
        provider.tamper = "bad_nonce"
        _sso_login(client)
    assert _logged_in_user(client) is None
    assert _sso_login(client)["Location"] == "/"
    client.logout()
    make_user("bob")
    assert client.post("/login/", {"username": "bob", "password": "pw-correct-horse"}).status_code == 302


# -- account linking: (issuer, subject) once linked; email only at the first login (issue 23, item 4) ------


@pytest.fixture(scope="module")
def second_provider():
    """Another provider (another issuer and signing key) that a deployment might move to."""
    served = OidcProvider().start()
    yield served
    served.stop()


def _sso_against(settings, sso, provider) -> None:
    endpoints = provider.endpoints()
    settings.SSO = replace(
        sso,
        issuer=endpoints["issuer"],
        authorization_endpoint=endpoints["authorization_endpoint"],
        token_endpoint=endpoints["token_endpoint"],
        userinfo_endpoint=endpoints["userinfo_endpoint"],
        jwks_endpoint=endpoints["jwks_uri"],
        end_session_endpoint=endpoints["end_session_endpoint"],
        client_id=provider.client_id,
        client_secret=provider.client_secret,
    )


def _identities() -> set[tuple[str, str, str]]:
    return {(i.issuer, i.subject, i.user.username) for i in SsoIdentity.objects.select_related("user").all()}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("local", "claimed"),
    [
        ("alice", "alıce@example.com"),  # dotless ı: Postgres' UPPER() makes it ALICE (iexact matched)
        ("sam", "ſam@example.com"),  # long s: UPPER() makes it SAM, NFKC and casefold make it "s"
        ("alice", "ａlice@example.com"),  # full-width a: NFKC makes it "a"
        ("alice", "ALİCE@example.com"),  # dotted capital İ: lower-cases to i + combining dot
    ],
)
def test_a_look_alike_verified_email_does_not_sign_in_as_the_local_account(
    client, provider, sso, make_user, local, claimed
):
    victim = make_user(local)  # <local>@example.com
    provider.user = {**_claims(groups=[], username="mallory", email=claimed), "sub": "sub-mallory"}

    response = _sso_login(client)

    assert response["Location"] == "/"
    user = _logged_in_user(client)
    assert user is not None and user.pk != victim.pk and user.username == "mallory"
    victim.refresh_from_db()
    assert victim.email == f"{local}@example.com" and victim.has_usable_password()
    assert not SsoIdentity.objects.filter(user=victim).exists()


@pytest.mark.django_db
def test_the_look_alike_attack_premise_holds_in_postgres(make_user):
    # What the old lookup (email__iexact, run as UPPER() = UPPER()) found for the provider's addresses.
    alice, sam = make_user("alice"), make_user("sam")
    users = get_user_model().objects
    assert list(users.filter(email__iexact="alıce@example.com")) == [alice]
    assert list(users.filter(email__iexact="ſam@example.com")) == [sam]


@pytest.mark.django_db
def test_a_verified_email_links_a_plain_account_once_then_the_subject_alone_signs_in(
    client, provider, sso, make_user, settings
):
    local = make_user("asmith", password="pw-correct-horse")
    provider.user = _claims(groups=[], username="alice.smith", email="ASmith@Example.com")
    _sso_login(client)
    assert _logged_in_user(client) == local
    identity = SsoIdentity.objects.get(user=local)
    assert (identity.issuer, identity.subject, identity.linked_by) == (sso.issuer, "sub-alice.smith", "email")

    # Later logins find her by subject, whatever email the provider sends, even an unverified one.
    client.logout()
    provider.user = _claims(groups=[], username="alice.smith", email="a.smith@corp.example", verified=False)
    settings.SSO = replace(sso, require_verified_email=False)
    _sso_login(client)
    assert _logged_in_user(client) == local
    local.refresh_from_db()
    # The verified address of the link stays: an unverified one never replaces the account's.
    assert local.email == "ASmith@Example.com"


@pytest.mark.django_db
def test_a_changed_email_at_the_provider_keeps_the_user_and_takes_over_no_other_account(
    client, provider, sso, make_user
):
    provider.user = _claims(groups=[])  # sub-alice, alice@corp.example
    _sso_login(client)
    alice = _logged_in_user(client)
    bob = make_user("bob")  # bob@example.com, a local account
    client.logout()

    # Alice's address at the provider becomes bob's (a reassigned or edited address, verified).
    provider.user = _claims(groups=[], email="bob@example.com")
    _sso_login(client)

    assert _logged_in_user(client) == alice
    alice.refresh_from_db()
    bob.refresh_from_db()
    assert alice.email == "alice@corp.example"  # not bob's: he keeps it, and his password resets
    assert bob.email == "bob@example.com" and bob.has_usable_password()
    assert not SsoIdentity.objects.filter(user=bob).exists()

    # A new address nobody else has follows the provider.
    client.logout()
    provider.user = _claims(groups=[], email="alice.liddell@corp.example")
    _sso_login(client)
    alice.refresh_from_db()
    assert _logged_in_user(client) == alice and alice.email == "alice.liddell@corp.example"


@pytest.mark.django_db
def test_the_same_subject_at_a_second_provider_is_another_identity(
    client, provider, second_provider, sso, settings
):
    provider.user = _claims(groups=[])  # sub-alice
    _sso_login(client)
    alice = _logged_in_user(client)
    client.logout()

    _sso_against(settings, sso, second_provider)
    second_provider.user = {**_claims(groups=[], username="mallory", email="mallory@corp.example")}
    second_provider.user["sub"] = "sub-alice"  # the same subject string, another issuer
    _sso_login(client)

    mallory = _logged_in_user(client)
    assert mallory is not None and mallory != alice and mallory.username == "mallory"
    assert _identities() == {
        (provider.issuer, "sub-alice", "alice"),
        (second_provider.issuer, "sub-alice", "mallory"),
    }


@pytest.mark.django_db
def test_an_account_linked_to_one_identity_is_not_linked_to_another_by_email(
    client, provider, second_provider, sso, settings
):
    provider.user = _claims(groups=[])
    _sso_login(client)
    client.logout()
    _sso_against(settings, sso, second_provider)
    second_provider.user = {**_claims(groups=[], username="alice-2"), "sub": "someone-else"}
    _sso_login(client)
    assert _logged_in_user(client) is None
    page = client.get("/login/").content.decode().replace("&#x27;", "'")
    assert "already linked to another single sign-on identity" in page
    assert len(_identities()) == 1


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["superuser", "staff"])
def test_an_administrators_email_does_not_sign_in_as_the_administrator(client, provider, sso, kind):
    users = get_user_model().objects
    if kind == "superuser":
        admin = users.create_superuser("root", "root@example.com", "pw-correct-horse")
    else:
        admin = users.create_user("root", "root@example.com", "pw-correct-horse", is_staff=True)
    provider.user = {**_claims(groups=[STAFF_GROUP], username="root-sso", email="root@example.com")}

    _sso_login(client)

    assert _logged_in_user(client) is None
    page = client.get("/login/").content.decode().replace("&#x27;", "'")
    assert "belongs to an administrator account" in page
    # What an admin needs to link it explicitly.
    assert f"(this sign-in: subject 'sub-root-sso' at {provider.issuer})" in page
    assert not SsoIdentity.objects.exists() and not users.filter(username="root-sso").exists()
    admin.refresh_from_db()
    assert admin.email == "root@example.com"


@pytest.mark.django_db
def test_an_admin_links_an_administrator_explicitly_and_then_it_signs_in(client, admin_client, provider, sso):
    root = get_user_model().objects.get(username="admin")  # pytest-django's admin_client superuser
    # The admin site's form: the explicit link (issuer, subject) -> account.
    response = admin_client.post(
        "/admin/jobs/ssoidentity/add/",
        {"issuer": sso.issuer, "subject": "sub-root", "user": root.pk},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert SsoIdentity.objects.get().linked_by == "admin"
    provider.user = {**_claims(groups=[STAFF_GROUP], username="root", email=root.email), "sub": "sub-root"}

    _sso_login(client)

    assert _logged_in_user(client) == root


@pytest.mark.django_db
def test_an_unverified_email_is_matched_to_no_account_even_when_the_provider_is_trusted_without_it(
    client, provider, sso, settings, make_user
):
    settings.SSO = replace(sso, require_verified_email=False)
    local = make_user("asmith")  # asmith@example.com
    provider.user = _claims(groups=[], username="alice.smith", email="asmith@example.com", verified=False)

    _sso_login(client)

    user = _logged_in_user(client)
    assert user is not None and user != local and user.username == "alice.smith"
    assert SsoIdentity.objects.get().linked_by == "first-login"
