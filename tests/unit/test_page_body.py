"""A page body split at its holes and kept in memory (jobs.views.page_body): no database."""

from __future__ import annotations

import threading

import pytest

from jobs.views.page_body import Body, BodyCache, fill, hole, split


def test_a_body_is_answered_with_each_requests_parts_in_its_holes() -> None:
    html = f"<form>{hole('csrf')}</form>é<p>{hole('compare')}</p><form>{hole('csrf')}</form>"
    body = split(html, ("csrf", "compare"))
    assert body.holes == {"csrf", "compare"}
    one = fill(body, {"csrf": b"token-1", "compare": b"<a>run</a>"})
    two = fill(body, {"csrf": b"token-2", "compare": b""})
    assert one.decode() == "<form>token-1</form>é<p><a>run</a></p><form>token-1</form>"
    assert two.decode() == "<form>token-2</form>é<p></p><form>token-2</form>"
    assert body.size == len(html.encode()) - 2 * len(hole("csrf")) - len(hole("compare"))


def test_a_hole_may_be_absent_but_never_unknown_or_left_unfilled() -> None:
    # A viewer who may not write sees no form, so no CSRF token: the body is valid without that hole.
    assert fill(split("<p>read only</p>", ("csrf",)), {}) == b"<p>read only</p>"
    with pytest.raises(ValueError, match="'user'"):
        split(f"<p>{hole('user')}</p>", ("csrf",))  # no request would fill it: the marker would be answered
    with pytest.raises(ValueError, match="'csrf'"):
        fill(split(f"<p>{hole('csrf')}</p>", ("csrf",)), {})
    with pytest.raises(ValueError, match="lowercase"):
        hole("CSRF-->")


def test_escaped_text_never_reads_as_a_hole() -> None:
    # What a user stored reaches the page escaped: a job named like a marker stays text, not a hole.
    from html import escape

    name = escape(hole("csrf"))
    assert fill(split(f"<h1>{name}</h1>", ("csrf",)), {"csrf": b"SECRET"}) == f"<h1>{name}</h1>".encode()


def _body(n: int) -> Body:
    return Body((b"x" * n,))


def test_the_cache_keeps_the_most_recently_used_bodies_within_its_byte_budget() -> None:
    bodies = BodyCache(100)
    bodies.put("a", _body(40))
    bodies.put("b", _body(40))
    assert bodies.get("a") is not None  # a is now the most recently used
    bodies.put("c", _body(40))  # 120 > 100: the least recently used (b) goes
    assert bodies.get("b") is None and bodies.get("a") is not None and bodies.get("c") is not None
    assert bodies.bytes == 80 and len(bodies) == 2
    bodies.put("a", _body(10))  # replacing an entry counts its new size only
    assert bodies.bytes == 50
    bodies.put("huge", _body(101))  # larger than the whole budget: not kept, nothing evicted for it
    assert bodies.get("huge") is None and len(bodies) == 2
    bodies.clear()
    assert bodies.bytes == 0 and bodies.get("a") is None


def test_a_body_older_than_the_max_age_is_not_answered() -> None:
    now = [1000.0]
    bodies = BodyCache(100, max_age_s=600, clock=lambda: now[0])
    bodies.put("a", _body(10))
    now[0] += 600
    assert bodies.get("a") is not None  # exactly the max age: still answered
    now[0] += 1
    assert bodies.get("a") is None and bodies.bytes == 0 and len(bodies) == 0
    bodies.put("a", _body(10))  # rendered again: a fresh entry
    assert bodies.get("a") is not None
    with pytest.raises(ValueError, match="> 0"):
        BodyCache(100, max_age_s=0)


def test_a_zero_budget_keeps_nothing_and_a_negative_one_is_refused() -> None:
    bodies = BodyCache(0)
    bodies.put("a", _body(1))
    assert bodies.get("a") is None
    with pytest.raises(ValueError, match=">= 0"):
        BodyCache(-1)


def test_the_cache_stays_within_budget_under_concurrent_threads() -> None:
    bodies = BodyCache(1000)

    def work(offset: int) -> None:
        for i in range(500):
            bodies.put((offset, i % 50), _body(30))
            bodies.get((offset, (i * 7) % 50))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bodies.bytes <= 1000 and bodies.bytes == 30 * len(bodies)
