"""Teams, their members and API tokens: who may write what (jobs.permissions reads them)."""

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
    """A machine credential for the REST API. Only a hash of the key is stored; the key is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="What uses it, e.g. 'slurm prolog on cluster A'.")
    prefix = models.CharField(max_length=8, help_text="First characters of the key, to recognise it.")
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…) for {self.user}"

    @staticmethod
    def hash_key(key: str) -> str:
        """sha256 of the key: tokens are long random strings, so a plain hash suffices (no guessing)."""
        return hashlib.sha256(key.encode()).hexdigest()

    @classmethod
    def issue(cls, user: object, name: str) -> tuple[ApiToken, str]:
        """Create a token for `user`; returns the row and the plaintext key (shown once, never stored)."""
        key = secrets.token_urlsafe(32)
        token = cls.objects.create(user=user, name=name, prefix=key[:8], key_hash=cls.hash_key(key))
        return token, key
