"""`manage.py job_summary EXTERNAL_ID --json`: the same JSON as GET /api/v1/jobs/{id}/."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from jobs.evaluation.costs import Amount
from jobs.outputs.summary import job_summary, summary_queryset


class Command(BaseCommand):
    help = "Print a job's summary (config, MFU, cost, waste, findings, artifacts)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("external_id")
        parser.add_argument("--json", action="store_true", help="print the API's JSON")

    def handle(self, *args: Any, **opts: Any) -> None:
        job = summary_queryset().filter(external_id=opts["external_id"]).first()
        if job is None:
            raise CommandError(f"no job with external id {opts['external_id']!r}")
        data = job_summary(job)
        if opts["json"]:
            self.stdout.write(json.dumps(data, indent=2, default=str))
            return
        m = data["metrics"]

        def pct(v: float | None) -> str:
            return "n/a" if v is None else f"{v * 100:.1f} %"

        def usd(v: float | None) -> str:
            return "n/a" if v is None else f"${v:,.0f}"

        self.stdout.write(f"{data['external_id']} {data['name']} ({data['status']}), team {data['team']}")
        self.stdout.write(
            f"  {data['gpu_count']} x {data['gpu_model'] or 'unknown GPU model'}  {data['dtype']}"
        )
        self.stdout.write(f"  MFU {pct(m['mfu'])}  HFU {pct(m['hfu'])}  SM active {pct(m['sm_active_mean'])}")
        waste = Amount.of(
            m["waste_per_day_usd"], m["waste_lower_bound_per_day_usd"], m["waste_unknown_reason"] or ""
        )
        self.stdout.write(f"  cost/day {usd(m['cost_per_day_usd'])}  waste/day {waste.text()}")
        for f in data["findings"]:
            impact = (
                "impact unknown" if f["waste_per_day_usd"] is None else f"{usd(f['waste_per_day_usd'])}/day"
            )
            self.stdout.write(f"  [{f['severity']}] {f['code']}: {f['title']} ({impact})")
