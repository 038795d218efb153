"""A rendered page body with holes, kept in this process's memory (no Django here: pure and tested without a
database).

A page that is the same for every viewer with the same rights, except for a few per-request parts (the CSRF
token of each form, a per-viewer section), is rendered once with a marker where each such part goes
(`hole`), split at the markers into UTF-8 bytes (`split`), and answered by joining the bytes with the
request's parts (`fill`): no template rendering, no re-encoding of the body.

The markers are HTML comments. Nothing a user stored can produce one: every value the templates print is
escaped (`<` becomes `&lt;`) and JSON in a <script> element has `<` as `\\u003C` (jobs.views.page_json), so
`<!--` only ever comes from the template that placed the hole.

`BodyCache` keeps bodies by key, least recently used first out, within a byte budget. Why this process's
memory rather than Redis: a body is most of a megabyte (the job page's figure JSON), which Redis would send
and pickle would copy on every view, and an entry can never outlive the code and templates that rendered it
(a deploy starts new processes). Each worker process renders a page once per version of its data.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

_MARKER = "<!--efficiency:hole:{}-->"
_HOLE = re.compile(r"<!--efficiency:hole:([a-z_]+)-->")


def hole(name: str) -> str:
    """The marker for the per-request part `name` (lowercase letters and underscores)."""
    if not re.fullmatch(r"[a-z_]+", name):
        raise ValueError(f"a hole's name is lowercase letters and underscores, not {name!r}")
    return _MARKER.format(name)


@dataclass(frozen=True)
class Body:
    """A page body split at its holes: `parts` alternates fixed HTML (UTF-8 bytes) and hole names (str);
    `extra` is what the per-request parts are drawn from, kept with the body (not part of the HTML)."""

    parts: tuple[bytes | str, ...]
    extra: Any = None

    @property
    def size(self) -> int:
        """Bytes of fixed HTML (what the body costs in memory, near enough)."""
        return sum(len(p) for p in self.parts if isinstance(p, bytes))

    @property
    def holes(self) -> set[str]:
        return {p for p in self.parts if isinstance(p, str)}


def split(html: str, holes: Collection[str], extra: Any = None) -> Body:
    """`html` cut at its hole markers. Every marker must name one of `holes`: a marker no request fills would
    be answered as it is. A hole may occur any number of times, or not at all (a viewer without the right to
    write sees no form, so no CSRF token)."""
    pieces = _HOLE.split(html)  # fixed, name, fixed, name, ..., fixed
    parts: list[bytes | str] = []
    for i, piece in enumerate(pieces):
        if i % 2:
            if piece not in holes:
                raise ValueError(f"the body has a hole {piece!r} that is not among {sorted(holes)}")
            parts.append(piece)
        elif piece:
            parts.append(piece.encode())
    return Body(tuple(parts), extra)


def fill(body: Body, values: Mapping[str, bytes]) -> bytes:
    """The body's bytes with each hole replaced by its value (every hole must have one)."""
    try:
        return b"".join(values[p] if isinstance(p, str) else p for p in body.parts)
    except KeyError as exc:
        raise ValueError(f"no value for the hole {exc.args[0]!r}") from None


class BodyCache:
    """Bodies by key, least recently used evicted first once their bytes pass `budget_bytes` (0: keeps
    nothing), none answered once older than `max_age_s` (what a key cannot name, as the archive rows behind
    cached figures, is then at most that old). Thread-safe: gunicorn's threaded workers answer requests on
    several threads of one process. `clock`: seconds, monotonic (tests pass their own)."""

    def __init__(
        self, budget_bytes: int, max_age_s: float = float("inf"), clock: Callable[[], float] = time.monotonic
    ) -> None:
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, not {budget_bytes}")
        if not max_age_s > 0:
            raise ValueError(f"max_age_s must be > 0, not {max_age_s}")
        self.budget_bytes = budget_bytes
        self.max_age_s = max_age_s
        self._clock = clock
        self._entries: OrderedDict[Hashable, tuple[Body, float]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Body | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if self._clock() - entry[1] > self.max_age_s:
                del self._entries[key]
                self._bytes -= entry[0].size
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: Hashable, body: Body) -> None:
        """Keep `body` under `key` (replacing what was there); a body larger than the budget is not kept."""
        size = body.size
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[0].size
            if size > self.budget_bytes:
                return
            self._entries[key] = (body, self._clock())
            self._bytes += size
            while self._bytes > self.budget_bytes:
                _, (evicted, _) = self._entries.popitem(last=False)
                self._bytes -= evicted.size

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)
