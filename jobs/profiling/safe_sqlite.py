"""Open an untrusted SQLite file safely: read-only, immutable, no extensions, bounded time and value size.

Used for Nsight Systems exports. `trusted_schema` is off so a crafted schema cannot run SQL functions
through views or triggers; callers read tables (never views) by name.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobs.profiling.errors import ArtifactError
from jobs.profiling.guard import checkpoint

SQLITE_MAGIC = b"SQLite format 3\x00"
_FETCH = 65536
# sqlite3 calls the progress handler every N virtual-machine instructions.
_PROGRESS_EVERY = 10_000
_MAX_VALUE_BYTES = 16 * 1024 * 1024


def check_sqlite_header(path: Path, what: str = "nsys export") -> None:
    """Refuse a file that does not start with the SQLite magic string, before SQLite parses it."""
    try:
        with path.open("rb") as handle:
            head = handle.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise ArtifactError(f"The {what} cannot be read: {exc.strerror or exc}.") from exc
    if head != SQLITE_MAGIC:
        raise ArtifactError(
            "The file is not an SQLite database (an nsys export must be `nsys export --type sqlite`)."
        )


class GuardedSQLite:
    """A read-only, time-bounded connection to an untrusted SQLite file, plus schema introspection.

    Errors, the time limit included, surface as `ArtifactError`; `what` names the file in messages.
    """

    def __init__(self, path: Path, timeout_s: float, what: str = "nsys export") -> None:
        self.what = what
        uri = path.resolve().as_uri() + "?mode=ro&immutable=1"
        try:
            self.con = sqlite3.connect(uri, uri=True, check_same_thread=True)
        except sqlite3.Error as exc:
            raise ArtifactError(f"The {what} cannot be opened as SQLite: {exc}.") from exc
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        if hasattr(self.con, "enable_load_extension"):
            self.con.enable_load_extension(False)
        self.con.set_progress_handler(self._progress, _PROGRESS_EVERY)
        for limit_name in ("SQLITE_LIMIT_LENGTH", "SQLITE_LIMIT_SQL_LENGTH"):
            category = getattr(sqlite3, limit_name, None)
            if category is not None and hasattr(self.con, "setlimit"):
                self.con.setlimit(category, _MAX_VALUE_BYTES)
        self.execute("PRAGMA trusted_schema = OFF")
        self.execute("PRAGMA query_only = ON")
        self.tables = {
            row[0]
            for row in self.fetchall("SELECT name FROM sqlite_master WHERE type = 'table'")
            if isinstance(row[0], str)
        }
        self._columns: dict[str, set[str]] = {}

    def _progress(self) -> int:
        # A non-zero return makes sqlite abort the running statement with "interrupted".
        return 1 if time.monotonic() > self.deadline else 0

    def _error(self, exc: sqlite3.Error, corrupt: str) -> ArtifactError:
        # The progress handler aborts a read that runs too long; SQLite reports it as "interrupted".
        if isinstance(exc, sqlite3.OperationalError):
            if "interrupt" in str(exc).lower():
                return ArtifactError(
                    f"Reading the {self.what} took longer than {self.timeout_s:g} s and was stopped."
                )
            return ArtifactError(f"The {self.what} cannot be read: {exc}.")
        return ArtifactError(f"{corrupt}: {exc}.")

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        try:
            return self.con.execute(sql, params)
        except sqlite3.DatabaseError as exc:
            raise self._error(exc, "The file is not a readable SQLite database") from exc

    def fetchall(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """All rows of a small query (schema, metadata), errors as `ArtifactError`."""
        cur = self.execute(sql, params)
        try:
            return cur.fetchall()
        except sqlite3.DatabaseError as exc:
            raise self._error(exc, f"The {self.what} is corrupt") from exc

    def one(self, sql: str, params: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
        """The first row of a query, or None; errors as `ArtifactError`."""
        cur = self.execute(sql, params)
        try:
            row: tuple[Any, ...] | None = cur.fetchone()
        except sqlite3.DatabaseError as exc:
            raise self._error(exc, f"The {self.what} is corrupt") from exc
        return row

    def rows(self, sql: str) -> Iterator[tuple[Any, ...]]:
        cur = self.execute(sql)
        while True:
            try:
                chunk = cur.fetchmany(_FETCH)
            except sqlite3.DatabaseError as exc:
                raise self._error(exc, f"The {self.what} is corrupt") from exc
            if not chunk:
                return
            checkpoint()
            yield from chunk

    def columns(self, table: str) -> set[str]:
        if table not in self._columns:
            # Table names come from sqlite_master, never from user input; quote them anyway.
            quoted = table.replace('"', '""')
            self._columns[table] = {
                row[1] for row in self.fetchall(f'PRAGMA table_info("{quoted}")') if isinstance(row[1], str)
            }
        return self._columns[table]

    def col(self, table: str, *names: str, default: str = "NULL") -> str:
        """The first of `names` that the table has, as a SQL expression; `default` if none."""
        cols = self.columns(table)
        for name in names:
            if name in cols:
                return f'"{name}"'
        return default

    def select(self, table: str, columns: list[tuple[str, ...]], where: str = "") -> str:
        """SELECT of the first existing column of each tuple; a tuple's last item is the default."""
        exprs = [self.col(table, *names[:-1], default=names[-1]) for names in columns]
        return f'SELECT {", ".join(exprs)} FROM "{table}"' + (f" WHERE {where}" if where else "")

    def close(self) -> None:
        self.con.close()
