"""`manage.py ingest --once`: poll running jobs and finalize ended ones synchronously (no worker needed)."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from jobs.pipeline import poll as pipeline


class Command(BaseCommand):
    help = "Poll running jobs and finalize ended jobs from Prometheus, synchronously."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--once", action="store_true", required=True, help="one pass, then exit")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **opts: Any) -> None:
        report = pipeline.ingest_once()
        if opts["json"]:
            self.stdout.write(json.dumps(report, indent=2))
        else:
            self.stdout.write(
                f"polled {len(report['polled'])}, finalized {len(report['finalized'])}, "
                f"stale {len(report['stale'])}"
            )
            for external_id in report["stale"]:
                self.stderr.write(f"  {external_id}: Prometheus unreachable, archived data kept")
        if report["stale"] and not (report["polled"] or report["finalized"]):
            raise CommandError("Prometheus was unreachable for every job")
