"""What the service sends and does on its own: weekly report deliveries, alert incidents, subscriptions and
deliveries, idle policies and their actions."""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from jobs.models.jobs import Finding, Job
from jobs.models.teams import Team


class ReportDelivery(models.Model):
    """One weekly email per team and ISO week; the row is claimed before sending so it goes out once."""

    class Status(models.TextChoices):
        CLAIMED = "claimed", "Sending"
        SENT = "sent", "Sent"
        FAILED = "failed", "Failed"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="report_deliveries")
    week_start = models.DateField(help_text="Monday of the ISO week reported on.")
    status = models.CharField(max_length=16, choices=Status.choices)
    claimed_at = models.DateTimeField(null=True, blank=True)
    claim_token = models.CharField(max_length=64, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    recipients = ArrayField(models.EmailField(), default=list, blank=True)
    error = models.TextField(blank=True)
    message_id = models.CharField(max_length=255, blank=True)

    class Meta:
        verbose_name_plural = "report deliveries"
        ordering = ["-week_start", "team"]
        constraints = [
            models.UniqueConstraint(fields=["team", "week_start"], name="one_report_per_team_week")
        ]

    def __str__(self) -> str:
        return f"{self.team} week of {self.week_start}: {self.status}"


# ------------------------------------------------------------------------------------------------ alerts


class AlertIncident(models.Model):
    """One alert rule firing on one running job: opened when its condition held for the rule's minimum
    duration, resolved when the condition clears. At most one open incident per (job, rule)."""

    class Rule(models.TextChoices):
        GPUS_IDLE = "gpus_idle", "GPUs idle"
        MFU_LOW = "mfu_low", "MFU below baseline / reference"
        THROTTLING = "throttling", "Throttling"
        XID_ERRORS = "xid_errors", "XID errors"
        STRAGGLER = "straggler", "Straggler"
        WASTE = "waste", "Waste above threshold"
        INGESTION_STALE = "ingestion_stale", "Ingestion stale"

    rule = models.CharField(max_length=32, choices=Rule.choices)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="incidents")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="incidents")
    started_at = models.DateTimeField(help_text="When the condition began (not when it was noticed).")
    opened_at = models.DateTimeField(help_text="When the incident was opened (condition held long enough).")
    last_seen_at = models.DateTimeField(help_text="Last evaluation that saw the condition.")
    resolved_at = models.DateTimeField(null=True, blank=True)
    finding = models.ForeignKey(
        Finding, null=True, blank=True, on_delete=models.SET_NULL, related_name="incidents"
    )
    finding_code = models.CharField(max_length=64, blank=True, help_text="Kept when the finding goes.")
    title = models.CharField(max_length=300)
    evidence = models.JSONField(default=list, blank=True, help_text="[{label, value, unit}]")
    resolve_reason = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-started_at", "rule"]
        indexes = [models.Index(fields=["team", "resolved_at"]), models.Index(fields=["job", "resolved_at"])]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "rule"],
                condition=Q(resolved_at__isnull=True),
                name="one_open_incident_per_rule",
            )
        ]

    def __str__(self) -> str:
        return f"{self.rule} on {self.job} since {self.started_at:%Y-%m-%d %H:%M}"

    @property
    def is_open(self) -> bool:
        return self.resolved_at is None


class AlertSubscription(models.Model):
    """Where a team's (or one user's own jobs') incidents are sent. Webhook URLs and secrets are stored
    encrypted (jobs.alerts.secrets) and never rendered back; `url_hint` is the non-secret scheme://host."""

    class Channel(models.TextChoices):
        EMAIL = "email", "Email"
        WEBHOOK = "webhook", "JSON webhook"
        SLACK = "slack", "Slack incoming webhook"
        ALERTMANAGER = "alertmanager", "Alertmanager webhook"

    team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.CASCADE, related_name="alert_subscriptions"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="alert_subscriptions",
        help_text="A personal subscription: incidents of jobs this user owns (Job.owner = username).",
    )
    channel = models.CharField(max_length=16, choices=Channel.choices)
    email = models.EmailField(blank=True)
    url_encrypted = models.TextField(blank=True)
    url_hint = models.CharField(max_length=300, blank=True)
    secret_encrypted = models.TextField(blank=True)
    rules = ArrayField(
        models.CharField(max_length=32), default=list, blank=True, help_text="Rules sent; empty = all."
    )
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["channel", "id"]
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(team__isnull=False, user__isnull=True) | Q(team__isnull=True, user__isnull=False)
                ),
                name="alert_subscription_team_xor_user",
            )
        ]

    def __str__(self) -> str:
        return f"{self.get_channel_display()} → {self.destination}"

    @property
    def destination(self) -> str:
        """What pages may show: the address, or the webhook's scheme://host (never the path or secret)."""
        return self.email if self.channel == self.Channel.EMAIL else self.url_hint

    @property
    def has_secret(self) -> bool:
        return bool(self.secret_encrypted)


class AlertDelivery(models.Model):
    """One message (incident opened or resolved) to one subscription; claimed before sending, so it goes
    out once even when polls repeat or a worker dies (as ReportDelivery for the weekly email)."""

    class Event(models.TextChoices):
        OPENED = "opened", "Opened"
        RESOLVED = "resolved", "Resolved"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        CLAIMED = "claimed", "Sending"
        SENT = "sent", "Sent"
        FAILED = "failed", "Failed (will retry)"
        GAVE_UP = "gave_up", "Failed (gave up)"

    incident = models.ForeignKey(AlertIncident, on_delete=models.CASCADE, related_name="deliveries")
    subscription = models.ForeignKey(AlertSubscription, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=16, choices=Event.choices)
    channel = models.CharField(max_length=16, choices=AlertSubscription.Channel.choices)
    destination = models.CharField(max_length=300, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    claimed_at = models.DateTimeField(null=True, blank=True)
    claim_token = models.CharField(max_length=64, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    response_status = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "alert deliveries"
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["incident", "subscription", "event"], name="one_delivery_per_incident_event"
            )
        ]

    def __str__(self) -> str:
        return f"{self.incident} {self.event} → {self.destination}: {self.status}"


class IdlePolicy(models.Model):
    """A team's opt-in idle-GPU policy: warn the owner after `warn_after_minutes` of idle GPUs, then after
    `grace_minutes` run the action (also gated by IDLE_POLICY_TEAMS and IDLE_POLICY_DRY_RUN)."""

    class Action(models.TextChoices):
        COMMAND = "command", "Command hook (e.g. scancel)"
        KUBERNETES = "kubernetes", "Kubernetes: suspend the owning Job/JobSet"

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="idle_policy")
    enabled = models.BooleanField(default=False)
    dry_run = models.BooleanField(default=True, help_text="Log what would be done, do nothing.")
    warn_after_minutes = models.PositiveIntegerField(default=30, validators=[MinValueValidator(1)])
    grace_minutes = models.PositiveIntegerField(default=30, validators=[MinValueValidator(0)])
    action = models.CharField(max_length=16, choices=Action.choices, default=Action.COMMAND)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "idle policies"

    def __str__(self) -> str:
        return f"idle policy of {self.team} ({'on' if self.enabled else 'off'})"


class PolicyAction(models.Model):
    """The log of the idle-GPU policy: every warning and action, with who/what/why and its outcome."""

    class Kind(models.TextChoices):
        WARN = "warn", "Warned the owner"
        CANCEL = "cancel", "Cancelled the job"

    class Outcome(models.TextChoices):
        DONE = "done", "Done"
        DRY_RUN = "dry_run", "Dry run (nothing done)"
        FAILED = "failed", "Failed"
        REFUSED = "refused", "Refused (not allowed)"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="policy_actions")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="policy_actions")
    incident = models.ForeignKey(AlertIncident, on_delete=models.CASCADE, related_name="policy_actions")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    actor = models.CharField(
        max_length=200, help_text="Who acted: the policy and the setting that allowed it."
    )
    target = models.CharField(max_length=300, help_text="What was acted on (job id, pod).")
    action = models.CharField(max_length=1000, blank=True, help_text="The command or API call.")
    reason = models.TextField(help_text="Why: the idle evidence.")
    detail = models.TextField(blank=True, help_text="Output or error.")
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-at"]
        constraints = [
            models.UniqueConstraint(fields=["incident", "kind"], name="one_policy_action_per_incident_kind")
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.target}: {self.outcome}"
