"""The leaderboard offers no future period (issue 28 item 10: it linked to next week, which has no data)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.outputs.leaderboard import iso_week, month


@pytest.mark.django_db
@pytest.mark.parametrize("by", ["week", "month"])
def test_the_current_period_has_no_next_link_and_a_past_one_has(client, make_user, make_team, by):
    client.force_login(make_user("alice", teams=[make_team("llm")]))
    today = timezone.now().date()
    current = iso_week(today) if by == "week" else month(today)
    html = client.get(f"/leaderboard/?{by}={current.label}").content.decode()
    following = iso_week(current.end.date()) if by == "week" else month(current.end.date())
    assert f"{by}={following.label}" not in html
    assert f"{current.label} is the current {by}" in html
    period_of = iso_week if by == "week" else month
    past = period_of((current.start - timedelta(days=40)).date())
    html = client.get(f"/leaderboard/?{by}={past.label}").content.decode()
    assert f"{by}={period_of(past.end.date()).label}" in html
