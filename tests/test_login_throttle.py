"""Login throttling (django-axes): N failed logins of a username from an address lock it out, a correct
password is then refused with the lockout page, the lock lifts after the cool-off; sessions from
force_login and API tokens are not logins and are unaffected."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.utils import timezone

pytestmark = pytest.mark.django_db

PASSWORD = "pw-correct-horse"


@pytest.fixture
def alice(make_team, make_user, settings):
    settings.AXES_ENABLED = True
    settings.AXES_FAILURE_LIMIT = 3
    settings.AXES_COOLOFF_TIME = timedelta(minutes=15)
    return make_user("alice", teams=[make_team("llm")], password=PASSWORD)


def _login(client, password: str):
    return client.post("/login/", {"username": "alice", "password": password})


def test_a_correct_login_works_and_a_wrong_one_is_counted(client, alice):
    assert _login(client, "wrong").status_code == 200  # the form again, with its error
    assert AccessAttempt.objects.get(username="alice").failures_since_start == 1
    assert _login(client, PASSWORD).status_code == 302
    assert not AccessAttempt.objects.filter(username="alice").exists()  # reset on success


def test_after_the_failure_limit_even_the_correct_password_is_refused_with_the_lockout_page(client, alice):
    for _ in range(3):
        _login(client, "wrong")
    response = _login(client, PASSWORD)
    assert response.status_code == 429
    text = response.content.decode()
    assert "Too many failed logins" in text and "after 3 failed logins" in text
    assert "_auth_user_id" not in client.session


def test_the_lock_lifts_after_the_cool_off(client, alice):
    for _ in range(3):
        _login(client, "wrong")
    assert _login(client, PASSWORD).status_code == 429
    # 16 minutes later (the cool-off is 15): the attempts are older than the cool-off.
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))
    assert _login(client, PASSWORD).status_code == 302


def test_force_login_sessions_and_api_tokens_are_unaffected_by_a_lockout(client, alice, api_client_for):
    for _ in range(4):
        _login(client, "wrong")
    assert api_client_for(alice).get("/api/v1/jobs/").status_code == 200
    client.force_login(alice)
    assert client.get("/").status_code == 200


def test_the_test_clients_login_without_a_request_still_authenticates(client, alice):
    # Client.login() calls authenticate() without a request: the throttle backend passes it on.
    assert client.login(username="alice", password=PASSWORD)
