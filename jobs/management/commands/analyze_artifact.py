"""`manage.py analyze_artifact PATH [--kind K] --json`: parse and analyse one artifact file locally."""

from __future__ import annotations

import json
import time
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from jobs.artifacts import REJECTED_KINDS, analyze_file
from jobs.models import Artifact
from jobs.profiling.detect import detect_kind, read_head
from jobs.profiling.errors import ArtifactError


class Command(BaseCommand):
    help = "Analyse a profiling artifact (Kineto, nsys SQLite, nsys stats, ncu, py-spy, nvidia-smi, dstat)."
    # Parsing reads no models' configuration: Django's system checks (URLs, admin, templates, database
    # settings) took 1.7 s before every parse started, longer than parsing a 50 MB trace.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("path")
        parser.add_argument("--kind", choices=Artifact.Kind.values, help="skip auto-detection")
        parser.add_argument("--rank", type=int, help="rank of a Kineto trace without distributedInfo")
        parser.add_argument("--json", action="store_true", help="print the whole analysis as JSON")

    def handle(self, *args: Any, **opts: Any) -> None:
        path = Path(opts["path"])
        if not path.is_file():
            raise CommandError(f"{path}: no such file")
        try:
            kind = opts["kind"] or detect_kind(path.name, read_head(path))
            if kind in REJECTED_KINDS:
                raise CommandError(REJECTED_KINDS[kind])
            started = time.perf_counter()
            analysis = analyze_file(path, kind, rank=opts["rank"], filename=path.name)
        except ArtifactError as exc:
            raise CommandError(f"{path.name}: {exc}") from None
        elapsed = time.perf_counter() - started
        if opts["json"]:
            self.stdout.write(json.dumps({"kind": kind, **analysis}, indent=2, default=str))
            return
        self.stdout.write(f"{path.name}: {kind}, analysed in {elapsed:.2f} s")
        for rank in analysis.get("ranks") or []:
            tb, ib = rank.get("temporal_breakdown") or {}, rank.get("idle_breakdown") or {}
            self.stdout.write(
                f"  rank {rank.get('rank')}: idle {tb.get('idle_pct')} %, compute {tb.get('compute_pct')} %, "
                f"non-compute {tb.get('non_compute_pct')} %; idle = host wait {ib.get('host_wait_pct')} %, "
                f"kernel wait {ib.get('kernel_wait_pct')} %, other {ib.get('other_pct')} %"
            )
        if not analysis.get("ranks"):
            self.stdout.write("  keys: " + ", ".join(sorted(analysis)))
