"""Messages shown next to the form that caused them: a view tags a message `at-<place>` (extra_tags), the
form's template shows `messages|at:"<place>"` beside itself, and the top of the page shows the rest."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import template

register = template.Library()

_PREFIX = "at-"


def _places(message: Any) -> set[str]:
    return {
        t[len(_PREFIX) :] for t in (getattr(message, "extra_tags", "") or "").split() if t.startswith(_PREFIX)
    }


@register.filter
def at(messages: Iterable[Any] | None, place: str) -> list[Any]:
    """The messages placed at `place`; with an empty place, those placed nowhere (for the page top)."""
    if not messages:
        return []
    if place:
        return [m for m in messages if place in _places(m)]
    return [m for m in messages if not _places(m)]
