"""`manage.py send_weekly_reports [--week 2026-W47] [--team SLUG] [--dry-run]`: send or preview the emails."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs.outputs.leaderboard import parse_iso_week
from jobs.outputs.reports import DeliveryOutcome, Outcome, default_period, send_weekly_reports


class Command(BaseCommand):
    help = (
        "Send each team's weekly cost-waste email for an ISO week (default: last week), at most once per "
        "team and week. Prints per team: sent, skipped (and why), failed (and why), or the dry-run preview. "
        "Exits with status 1 when any email failed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--week", help="ISO week like 2026-W47 (default: the previous week)")
        parser.add_argument("--team", metavar="SLUG", help="only this team")
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="print subject, recipients and text body; send nothing, record nothing",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["week"]:
            try:
                period = parse_iso_week(options["week"])
            except ValueError as exc:
                raise CommandError(f"--week: {exc}") from None
        else:
            period = default_period()
        try:
            outcomes = send_weekly_reports(period, team_slug=options["team"], dry_run=options["dry_run"])
        except ValueError as exc:
            raise CommandError(f"--team: {exc}") from None
        if not outcomes:
            self.stdout.write(f"No teams: nothing to send for {period.label}.")
        for outcome in outcomes:
            self._print(outcome)
        failed = [o for o in outcomes if o.status == Outcome.FAILED]
        if failed:
            # A non-zero exit lets cron or a wrapper alert; rerunning retries only the failed teams.
            raise CommandError(f"{len(failed)} of {len(outcomes)} report(s) failed for {period.label}")

    def _print(self, outcome: DeliveryOutcome) -> None:
        line = f"{outcome.team_slug} {outcome.week}: {outcome.describe()}"
        if outcome.status == Outcome.SENT:
            self.stdout.write(self.style.SUCCESS(line))
        elif outcome.status == Outcome.FAILED:
            self.stdout.write(self.style.ERROR(line))
        else:
            self.stdout.write(line)
        if outcome.status == Outcome.DRY_RUN:
            self.stdout.write(f"Subject: {outcome.subject}")
            self.stdout.write(f"To: {', '.join(outcome.recipients)}")
            self.stdout.write("")
            self.stdout.write(outcome.text.rstrip())
            self.stdout.write("-" * 72)
