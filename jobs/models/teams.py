"""Teams, their members and API tokens: who may write what (jobs.access.permissions reads them)."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import MinValueValidator
from django.db import models


class Team(models.Model):
    """A group of people who own jobs; writes through the API are scoped to the caller's teams."""

    slug = models.SlugField(unique=True, max_length=64)
    name = models.CharField(max_length=200)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="teams")
    extra_report_recipients = ArrayField(
        models.EmailField(),
        default=list,
        blank=True,
        help_text="Addresses outside the team that get the weekly email.",
    )
    monthly_budget_usd = models.DecimalField(
        max_digits=12,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="Optional GPU spend budget per calendar month, US dollars ($ this month); empty: none.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    """A user in a team; `weekly_report` is the per-user opt-out of the cost-waste email."""

    class Role(models.TextChoices):
        MEMBER = "member", "Member"
        LEAD = "lead", "Lead"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    weekly_report = models.BooleanField(default=True, help_text="Receive the weekly cost-waste email.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="membership_unique")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team}"


class ApiToken(models.Model):
    """A machine credential for the REST API. Only a hash of the key is stored; the key is shown once.

    A `user` token acts as its user (a member registers its own team's jobs). A `scheduler` token is the
    cluster-scoped service credential of a scheduler integration (Slurm prolog/epilog, a Kubernetes
    registrar): it registers, updates and ends jobs of any team on its `cluster`, declaring team and owner
    (jobs.access.ownership); its user is only the account it is recorded under."""

    class Kind(models.TextChoices):
        USER = "user", "User (acts as its user)"
        SCHEDULER = "scheduler", "Scheduler integration (cluster-scoped service credential)"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="What uses it, e.g. 'slurm prolog on cluster A'.")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.USER)
    cluster = models.CharField(
        max_length=100,
        blank=True,
        help_text="The scheduler cluster a scheduler token speaks for (required for kind=scheduler).",
    )
    prefix = models.CharField(max_length=8, help_text="First characters of the key, to recognise it.")
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API token"
        constraints = [
            models.CheckConstraint(
                condition=~models.Q(kind="scheduler") | ~models.Q(cluster=""),
                name="apitoken_scheduler_has_cluster",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…) for {self.user}"

    @staticmethod
    def hash_key(key: str) -> str:
        """sha256 of the key: tokens are long random strings, so a plain hash suffices (no guessing)."""
        return hashlib.sha256(key.encode()).hexdigest()

    @property
    def is_scheduler(self) -> bool:
        """True for a cluster-scoped scheduler credential."""
        return self.kind == self.Kind.SCHEDULER

    @classmethod
    def issue(cls, user: object, name: str, *, kind: str = "user", cluster: str = "") -> tuple[ApiToken, str]:
        """Create a token for `user`; returns the row and the plaintext key (shown once, never stored).

        A scheduler token needs its `cluster` (ValueError without one)."""
        if kind not in cls.Kind.values:
            raise ValueError(f"unknown token kind {kind!r}; use one of {', '.join(cls.Kind.values)}")
        cluster = cluster.strip()
        if kind == cls.Kind.SCHEDULER and not cluster:
            raise ValueError("a scheduler token needs the cluster it speaks for")
        key = secrets.token_urlsafe(32)
        token = cls.objects.create(
            user=user, name=name, prefix=key[:8], key_hash=cls.hash_key(key), kind=kind, cluster=cluster
        )
        return token, key
