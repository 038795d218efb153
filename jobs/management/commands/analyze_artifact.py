"""`manage.py analyze_artifact PATH [--kind K] --json`: parse and analyse one artifact file locally.

`manage.py` runs the same command line without Django (`jobs.profiling.analyze.main`); this class is what
`call_command` and a `manage.py` with Django's own options (`--settings`, `-v`, ...) run. Both share
`add_arguments` and `run`, so they print the same thing."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from jobs.profiling import analyze


class Command(BaseCommand):
    help = "Analyse a profiling artifact (Kineto, nsys SQLite, nsys stats, ncu, py-spy, nvidia-smi, dstat)."
    # Parsing reads no models' configuration: Django's system checks (URLs, admin, templates, database
    # settings) took 1.7 s before every parse started, longer than parsing a 50 MB trace.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: ArgumentParser) -> None:
        analyze.add_arguments(parser)

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            analyze.run(opts, self.stdout, max_decompressed_bytes=settings.ARTIFACT_MAX_DECOMPRESSED_BYTES)
        except analyze.CommandFailed as exc:
            raise CommandError(str(exc)) from None
