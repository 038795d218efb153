"""`manage.py load_demo --tsdb DIR`: demo teams, users and a simulated cluster backfilled into Prometheus."""

from __future__ import annotations

import time
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from jobs.demo import loader
from jobs.simulate import BackfillError


class Command(BaseCommand):
    help = (
        "Create demo teams and users (demo / demo-password) and a simulated cluster: one job per diagnosis "
        "scenario, running jobs, the seed articles' runs before and after their fixes, and six weeks of "
        "history. Metrics are written into the Prometheus TSDB directory given; restart Prometheus, start "
        "the web server (it serves the simulated exporter), then run `load_demo --finish`."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--tsdb", help="Prometheus --storage.tsdb.path to backfill into")
        parser.add_argument(
            "--finish",
            action="store_true",
            help="second step, once Prometheus has loaded the blocks: ingest, attach traces, baselines",
        )
        parser.add_argument(
            "--state-dir", help="where to keep the running jobs' specs (default DEMO_STATE_DIR)"
        )
        parser.add_argument(
            "--wait-live",
            type=float,
            default=loader.LIVE_WAIT_S,
            metavar="SECONDS",
            help="--finish: how long to wait for Prometheus to scrape the running jobs from the simulated "
            "exporter before the first poll (0: do not wait)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        began = time.monotonic()

        def progress(line: str) -> None:
            # One line per phase with the time since the command started: a first load takes minutes.
            self.stdout.write(f"[{time.monotonic() - began:6.1f} s] {line}")
            self.stdout.flush()

        if opts["finish"]:
            if opts["wait_live"] < 0:
                raise CommandError("--wait-live must be >= 0 seconds")
            report = loader.finish(progress, wait_live_s=opts["wait_live"])
            self.stdout.write(
                f"demo: polled {len(report['polled'])}, finalized {len(report['finalized'])}, "
                f"stale {len(report['stale'])}; "
                f"{report['baselines_promoted_runs']} runs promoted to baselines"
            )
            return
        if not opts["tsdb"]:
            raise CommandError("give --tsdb DIR (or --finish after restarting Prometheus)")
        state = opts["state_dir"] or settings.DEMO_STATE_DIR
        if not state:
            raise CommandError("give --state-dir or set DEMO_STATE_DIR")
        try:
            report = loader.load(Path(opts["tsdb"]), Path(state), progress=progress)
        except BackfillError as exc:
            raise CommandError(f"promtool could not backfill the demo metrics: {exc}") from None
        self.stdout.write(
            f"demo: {report['jobs_created']} jobs created, {report['jobs_existing']} already there, "
            f"{report['live_jobs']} running on the simulated exporter"
        )
