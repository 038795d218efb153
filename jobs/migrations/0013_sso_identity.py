"""SSO identities (issuer + subject -> user) and team-scoped baselines (issue 23, items 3 and 4).

Baselines: one active baseline per (team, fingerprint) instead of per fingerprint. Existing baselines that
pooled several teams' runs are split by their runs' team: the baseline keeps its own team's runs, and each
other team's runs move (with their promotion overrides) to a new baseline of that team with the same
fingerprint, config and state (active or retired). Statistics are recomputed over the runs each keeps.
After migrating, `manage.py reevaluate --all` brings the stored reference MFUs (and waste) to the
team-scoped baselines.
"""

from __future__ import annotations

from typing import Any

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class _Run:
    """A historical Job seen through the attributes jobs.evaluation.baselines.METRICS read (the historical
    model has the columns but not the `evaluated` property)."""

    def __init__(self, job: Any) -> None:
        self._job = job

    def __getattr__(self, name: str) -> Any:
        return getattr(self._job, name)

    @property
    def evaluated(self) -> Any:
        from jobs.evaluation.schema import decode

        return decode(self._job.evaluation)


def _stats(runs: list[Any]) -> dict[str, Any]:
    from jobs.evaluation.baselines import stats_for

    return stats_for([_Run(run) for run in runs])  # type: ignore[misc]


def split_by_team(apps: Any, schema_editor: Any) -> None:
    """Each baseline keeps its own team's runs; other teams' runs go to a new baseline of their team."""
    Baseline = apps.get_model("jobs", "Baseline")
    PromotionOverride = apps.get_model("jobs", "PromotionOverride")
    for baseline in Baseline.objects.order_by("pk"):
        runs = list(baseline.runs.all())
        by_team: dict[int, list[Any]] = {}
        for run in runs:
            by_team.setdefault(run.team_id, []).append(run)
        foreign = {team: team_runs for team, team_runs in by_team.items() if team != baseline.team_id}
        if not foreign:
            continue
        for team_id, team_runs in sorted(foreign.items()):
            split = Baseline.objects.create(
                fingerprint=baseline.fingerprint,
                model_name=baseline.model_name,
                team_id=team_id,
                config=baseline.config,
                created_by_id=None,
                retired_at=baseline.retired_at,
                stats=_stats(team_runs),
            )
            split.runs.add(*team_runs)
            baseline.runs.remove(*team_runs)
            PromotionOverride.objects.filter(baseline=baseline, job__in=team_runs).update(baseline=split)
        baseline.stats = _stats(by_team.get(baseline.team_id, []))
        baseline.save(update_fields=["stats"])
    # Fire the deferred foreign-key checks now: Postgres refuses the ALTER TABLE of the constraint below on
    # a table with pending trigger events.
    schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    schema_editor.execute("SET CONSTRAINTS ALL DEFERRED")


def merge_by_fingerprint(apps: Any, schema_editor: Any) -> None:
    """Reverse: each fingerprint's active baselines of several teams merge into the oldest one (the
    per-fingerprint constraint restored below allows one)."""
    Baseline = apps.get_model("jobs", "Baseline")
    PromotionOverride = apps.get_model("jobs", "PromotionOverride")
    active = Baseline.objects.filter(retired_at__isnull=True).order_by("fingerprint", "created_at", "pk")
    keeper: dict[str, Any] = {}
    for baseline in active:
        into = keeper.setdefault(baseline.fingerprint, baseline)
        if into.pk == baseline.pk:
            continue
        into.runs.add(*baseline.runs.all())
        PromotionOverride.objects.filter(baseline=baseline).update(baseline=into)
        into.stats = _stats(list(into.runs.all()))
        into.save(update_fields=["stats"])
        baseline.delete()
    schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    schema_editor.execute("SET CONSTRAINTS ALL DEFERRED")


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0012_ownership"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="SsoIdentity",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "issuer",
                    models.CharField(help_text="The provider's issuer URL (the ID token's iss).", max_length=500),
                ),
                (
                    "subject",
                    models.CharField(
                        help_text="The provider's id of the person (the ID token's sub; 255 ASCII at most).",
                        max_length=255,
                    ),
                ),
                (
                    "email_at_link",
                    models.CharField(
                        blank=True,
                        help_text="The email the provider sent when the identity was linked.",
                        max_length=254,
                    ),
                ),
                (
                    "linked_by",
                    models.CharField(
                        default="first-login",
                        help_text="first-login (new account), email (an existing account's verified email) or admin.",
                        max_length=32,
                    ),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("last_login_at", models.DateTimeField(blank=True, null=True)),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="sso_identities",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "verbose_name": "SSO identity",
                "verbose_name_plural": "SSO identities",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("issuer", "subject"), name="sso_identity_unique_issuer_subject"
                    )
                ],
            },
        ),
        migrations.RemoveConstraint(model_name="baseline", name="one_active_baseline_per_fingerprint"),
        migrations.RunPython(split_by_team, merge_by_fingerprint),
        migrations.AddConstraint(
            model_name="baseline",
            constraint=models.UniqueConstraint(
                condition=models.Q(("retired_at__isnull", True)),
                fields=("team", "fingerprint"),
                name="one_active_baseline_per_team_fingerprint",
            ),
        ),
    ]
