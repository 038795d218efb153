"""Service health (issue 23, items 5 and 7): the poll cycle's heartbeat row, and delivery errors without
receivers' reply bodies.

Before, a failed webhook delivery stored "HTTP <status>: <first 300 characters of the reply>" and the
alerts page and API showed it: a subscription to Prometheus' query API showed Prometheus' answer. Stored
errors of that form keep their status code only; connection errors that quoted the webhook's URL path (a
secret for Slack) are replaced by a plain sentence.
"""

from __future__ import annotations

import re
from typing import Any

from django.db import migrations, models

_WITH_BODY = re.compile(r"^HTTP (\d{3}): .*", re.DOTALL)


def _drop_reply_bodies(apps: Any, schema_editor: Any) -> None:
    delivery = apps.get_model("jobs", "AlertDelivery")
    rows = delivery.objects.filter(error__regex=r"^HTTP [0-9]{3}: ").values_list("pk", "error")
    for pk, error in rows.iterator():
        match = _WITH_BODY.match(error)
        if match:
            delivery.objects.filter(pk=pk).update(error=f"HTTP {match.group(1)}")
    # requests' connection errors named the URL's path ("... with url: /services/T0/B0/<token>"), which
    # pages must never show (the URL is stored sealed).
    delivery.objects.filter(error__contains="with url: ").update(
        error="connection failed (the recorded message named the webhook URL and was dropped)"
    )


class Migration(migrations.Migration):
    dependencies = [("jobs", "0013_sso_identity")]

    operations: list[migrations.operations.base.Operation] = [
        migrations.CreateModel(
            name="ServiceHeartbeat",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=64, unique=True)),
                ("finished_at", models.DateTimeField()),
                ("duration_s", models.FloatField(default=0.0)),
                (
                    "detail",
                    models.JSONField(blank=True, default=dict, help_text="The run's figures (jobs, stale, ...)."),
                ),
            ],
        ),
        migrations.RunPython(_drop_reply_bodies, migrations.RunPython.noop),
    ]
