"""`manage.py reevaluate [JOB ...] [--all]`: recompute stored jobs' evaluation from their archive.

After an upgrade that changes a definition (the evaluation's schema version), or after editing the price
book or baselines outside the admin, this brings every stored job to the current definitions without
Prometheus (a job's archive is enough)."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from jobs.models import Job
from jobs.pipeline.refresh import reevaluate_many


class Command(BaseCommand):
    help = "Re-evaluate stored jobs (MFU, cost, waste) from their archived signals."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("jobs", nargs="*", help="external ids; none with --all means every job")
        parser.add_argument("--all", action="store_true", help="every job")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["jobs"]:
            found = dict(Job.objects.filter(external_id__in=opts["jobs"]).values_list("external_id", "pk"))
            unknown = sorted(set(opts["jobs"]) - set(found))
            if unknown:
                raise CommandError(f"no such job: {', '.join(unknown)}")
            ids = list(found.values())
        elif opts["all"]:
            ids = list(Job.objects.order_by("pk").values_list("pk", flat=True))
        else:
            raise CommandError("name jobs by external id, or pass --all")
        done = reevaluate_many(ids)
        self.stdout.write(f"re-evaluated {done} of {len(ids)} jobs")
        if done < len(ids):
            raise CommandError(f"{len(ids) - done} jobs failed; see the log")
