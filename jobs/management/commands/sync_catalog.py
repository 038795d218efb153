"""`manage.py sync_catalog`: add GPU models and seed prices that this release knows and the database lacks."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from jobs.demo.seed import seed_catalog
from jobs.models import GpuModel, PriceEntry


class Command(BaseCommand):
    help = "Add missing GPU catalog entries and seed prices (never overwrites admin edits)."

    def handle(self, *args: Any, **opts: Any) -> None:
        models, prices = seed_catalog(GpuModel, PriceEntry)
        self.stdout.write(f"added {models} GPU models and {prices} prices")
