"""The staff settings page (issue 28): effective values and where each came from, secrets masked."""

from __future__ import annotations

import pytest

from efficiency.env import effective_settings, mask


def test_secrets_and_url_passwords_are_never_shown():
    assert mask("SECRET_KEY", "s3cr3t") == ("set (hidden)", True)
    assert mask("METRICS_TOKEN", "") == ("not set", True)
    assert mask("OIDC_CLIENT_SECRET", "x") == ("set (hidden)", True)
    shown, secret = mask("DATABASE_URL", "postgres://efficiency:hunter2@db:5432/efficiency")
    assert shown == "postgres://efficiency:***@db:5432/efficiency" and secret
    assert mask("TARGET_MFU", 0.45) == ("0.45", False)
    assert mask("ALLOWED_HOSTS", ["a", "b"]) == ("a, b", False)


def test_rows_say_where_each_value_came_from():
    rows = effective_settings(
        {"TARGET_MFU": True, "REDIS_URL": False, "SECRET_KEY": True},
        {"TARGET_MFU": 0.4, "SECRET_KEY": "abc"},
        {"TARGET_MFU": "0.4", "SECRET_KEY": "abc"},
    )
    by_name = {r.name: r for r in rows}
    assert [r.name for r in rows] == ["REDIS_URL", "SECRET_KEY", "TARGET_MFU"]
    assert by_name["TARGET_MFU"].value == "0.4" and by_name["TARGET_MFU"].source == "environment"
    assert by_name["REDIS_URL"].source == "default"
    assert by_name["SECRET_KEY"].value == "set (hidden)"


@pytest.mark.django_db
def test_staff_see_the_settings_page_and_members_get_403(client, make_user, make_team):
    member = make_user("alice", teams=[make_team("llm")])
    client.force_login(member)
    assert client.get("/settings/").status_code == 403
    staff = make_user("root", staff=True)
    client.force_login(staff)
    response = client.get("/settings/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-name="TARGET_MFU"' in html and 'data-name="SECRET_KEY"' in html
    from django.conf import settings

    assert settings.SECRET_KEY not in html
    assert "set (hidden)" in html


def test_anonymous_is_sent_to_login(client, db):
    response = client.get("/settings/")
    assert response.status_code == 302 and "/login/" in response["Location"]
