"""Small layout fixes of issue 28 item 10, seen in Chromium."""

from __future__ import annotations

from tests.browser.conftest import log_in


def test_my_jobs_checkbox_sits_on_its_labels_line(watched, live_server, member):
    log_in(watched, live_server.url, member.username)
    page = watched.page
    page.goto(live_server.url + "/")
    box = page.locator("input[name=mine]").bounding_box()
    text = page.locator("label.check").bounding_box()
    assert box is not None and text is not None
    # One line: the checkbox's middle within the label's height, and the label no taller than a line or so.
    middle = box["y"] + box["height"] / 2
    assert text["y"] <= middle <= text["y"] + text["height"]
    assert text["height"] < 2.2 * box["height"] + 8
    watched.shot("job-list-my-jobs", full_page=False)
    watched.assert_clean()
