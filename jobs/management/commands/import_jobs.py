"""`manage.py import_jobs FILE.json`: register a list of jobs (the same bodies POST /api/v1/jobs/ takes)."""

from __future__ import annotations

import json
import sys
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from jobs.access.ownership import Claimant, OwnershipError
from jobs.api.serializers import JobRegisterSerializer
from jobs.intake.registry import RegistryError, register_job
from jobs.models import Job


class Command(BaseCommand):
    help = "Register or update jobs from a JSON file holding a list of job bodies (see the API docs)."
    # BaseCommand has no stdin of its own; call_command(..., stdin=StringIO(...)) can pass one (tests).
    stealth_options = ("stdin",)

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("file", help="path to a JSON list, or - for standard input")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            text = (
                (opts.get("stdin") or sys.stdin).read()
                if opts["file"] == "-"
                else Path(opts["file"]).read_text()
            )
            bodies = json.loads(text)
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot read {opts['file']}: {exc}") from None
        if not isinstance(bodies, list):
            raise CommandError("the file must hold a JSON list of job bodies")
        created = updated = 0
        errors: list[str] = []
        for i, body in enumerate(bodies):
            serializer = JobRegisterSerializer(data=body)
            label = body.get("external_id", f"#{i}") if isinstance(body, dict) else f"#{i}"
            if not serializer.is_valid():
                errors.append(f"{label}: {json.dumps(serializer.errors)}")
                continue
            try:
                importer = Claimant.platform(Job.Provenance.IMPORT, "manage.py import_jobs")
                outcome = register_job(serializer.validated_data, importer)
            except (RegistryError, OwnershipError) as exc:
                errors.append(f"{label}: {exc}")
                continue
            created += outcome.created
            updated += not outcome.created
        self.stdout.write(f"created {created}, updated {updated}, rejected {len(errors)}")
        for line in errors:
            self.stderr.write(f"  {line}")
        if errors:
            raise CommandError(f"{len(errors)} job(s) rejected")
