"""Uploaded profiling artifacts: where each is stored, its parse state and its review."""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models

from jobs.models.jobs import Job


class ArtifactQuerySet(models.QuerySet["Artifact"]):
    """Artifact queries the diagnosis and pages share."""

    def used_in_diagnosis(self) -> ArtifactQuerySet:
        """Parsed, not excluded, and fitting the job or confirmed by a user (`Artifact.used_in_diagnosis`)."""
        return self.filter(status=Artifact.Status.DONE, excluded_at__isnull=True).filter(
            ~models.Q(run_check=Artifact.RunCheck.MISMATCH) | models.Q(confirmed_at__isnull=False)
        )


class Artifact(models.Model):
    """An uploaded profiling file, stored content-addressed, parsed by a worker into `analysis`.

    An artifact whose own metadata does not fit its job (`run_check` mismatch) changes nothing until a user
    confirms it; any artifact can be excluded from the diagnosis and stays listed.
    """

    class Kind(models.TextChoices):
        KINETO = "kineto", "PyTorch profiler / Kineto trace"
        NSYS_SQLITE = "nsys_sqlite", "Nsight Systems SQLite export"
        NSYS_STATS = "nsys_stats_csv", "nsys stats CSV"
        NCU = "ncu_csv", "Nsight Compute CSV"
        PYSPY_RAW = "pyspy_raw", "py-spy raw"
        PYSPY_SPEEDSCOPE = "pyspy_speedscope", "py-spy speedscope JSON"
        NVIDIA_SMI = "nvidia_smi_csv", "nvidia-smi CSV"
        DSTAT = "dstat_csv", "dstat CSV"

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        PARSING = "parsing", "Parsing"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    class RunCheck(models.TextChoices):
        """Whether the artifact's own metadata (GPU model, capture time, rank) fits its job."""

        PENDING = "pending", "Not checked yet"
        MATCHES = "matches", "Matches the job"
        UNVERIFIABLE = "unverifiable", "Cannot be checked (the file carries no GPU, time or rank)"
        MISMATCH = "mismatch", "Does not match the job"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="artifacts")
    kind = models.CharField(max_length=32, choices=Kind.choices)
    rank = models.PositiveIntegerField(null=True, blank=True)
    original_name = models.CharField(max_length=255)
    sha256 = models.CharField(max_length=64, db_index=True)
    size_bytes = models.PositiveBigIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    error = models.TextField(blank=True)
    analysis = models.JSONField(default=dict, blank=True)
    uploaded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    uploaded_at = models.DateTimeField(auto_now_add=True)
    parsed_at = models.DateTimeField(null=True, blank=True)
    parse_started_at = models.DateTimeField(
        null=True, blank=True, help_text="When the current parse attempt began (stuck-parse sweep)."
    )
    parse_attempts = models.PositiveIntegerField(
        default=0, help_text="Parse attempts started, redeliveries after lost workers included."
    )
    run_check = models.CharField(max_length=16, choices=RunCheck.choices, default=RunCheck.PENDING)
    run_mismatches = ArrayField(
        models.CharField(max_length=300),
        default=list,
        blank=True,
        help_text="Why the artifact does not fit its job (GPU model, capture time, rank).",
    )
    confirmed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    confirmed_at = models.DateTimeField(
        null=True, blank=True, help_text="A user confirmed a mismatched artifact belongs to this job."
    )
    excluded_at = models.DateTimeField(
        null=True, blank=True, help_text="Excluded from the diagnosis by a user (kept, shown, not used)."
    )
    excluded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    objects = ArtifactQuerySet.as_manager()

    class Meta:
        ordering = ["-uploaded_at"]
        constraints = [models.UniqueConstraint(fields=["job", "sha256"], name="artifact_unique_per_job")]

    def __str__(self) -> str:
        return f"{self.original_name} ({self.get_kind_display()})"

    @property
    def used_in_diagnosis(self) -> bool:
        """Parsed, not excluded, and either fitting its job or confirmed by a user despite a mismatch."""
        if self.status != self.Status.DONE or self.excluded_at is not None:
            return False
        return self.run_check != self.RunCheck.MISMATCH or self.confirmed_at is not None
