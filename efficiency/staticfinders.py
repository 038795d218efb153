"""Serve plotly.min.js from the installed (pinned) plotly package as static/vendor/plotly.min.js.

Keeps a 4.6 MB generated file out of the repository while still serving it from our own origin (no CDN);
`collectstatic` copies it like any other static file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, overload

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

_NAME = "vendor/plotly.min.js"


def _plotly_dir() -> Path:
    return Path(plotly.__file__).resolve().parent / "package_data"


class PlotlyFinder(BaseFinder):
    """A staticfiles finder that knows exactly one file: the plotly.js bundled with the Python package."""

    def check(self, **kwargs: Any) -> list[Any]:
        return []

    @overload
    def find(self, path: str, find_all: Literal[False] = False, **kwargs: Any) -> str | None: ...
    @overload
    def find(self, path: str, find_all: Literal[True], **kwargs: Any) -> list[str]: ...
    def find(self, path: str, find_all: bool = False, **kwargs: Any) -> str | list[str] | None:
        if path == _NAME:
            found = str(_plotly_dir() / "plotly.min.js")
            return [found] if find_all else found
        return [] if find_all else ""

    def list(self, ignore_patterns: Any) -> Any:
        storage = FileSystemStorage(location=str(_plotly_dir()))
        storage.prefix = "vendor"  # type: ignore[attr-defined]
        yield "plotly.min.js", storage
