"""`manage.py reseal_alert_secrets`: seal every stored webhook URL and secret again under the first key, the
step between adding a new key (ALERT_SECRET_KEYS, or SECRET_KEY with the old one in SECRET_KEY_FALLBACKS) and
dropping the old one."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from jobs.alerts import secrets
from jobs.models import AlertSubscription


class Command(BaseCommand):
    help = "Re-seal webhook URLs and secrets under the first key of ALERT_SECRET_KEYS (or the SECRET_KEY's)."

    def handle(self, *args: Any, **opts: Any) -> None:
        changed = unreadable = 0
        for sub in AlertSubscription.objects.exclude(url_encrypted="", secret_encrypted="").iterator():
            fields = {}
            for name in ("url_encrypted", "secret_encrypted"):
                stored = getattr(sub, name)
                if stored and not secrets.reveal(stored):
                    unreadable += 1
                    continue
                fresh = secrets.reseal(stored)
                if fresh != stored:
                    fields[name] = fresh
            if fields:
                AlertSubscription.objects.filter(pk=sub.pk).update(**fields)
                changed += 1
        self.stdout.write(
            f"resealed {changed} subscription(s); {unreadable} value(s) open under no current key (left "
            "as they are: restore the old key to read them, or enter them again on the alerts page)"
        )
