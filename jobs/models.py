"""Data model: teams, the GPU catalog and price book, jobs with their archived series, artifacts,
findings, baselines, API tokens and weekly report deliveries."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from jobs.evaluation.costs import Amount
from jobs.evaluation.schema import Evaluation, decode


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


class GpuModel(models.Model):
    """A GPU model of the catalog: dense peak TFLOP/s per dtype and the specs the math needs."""

    name = models.CharField(max_length=100, unique=True, help_text="Canonical name, e.g. 'H100 SXM'.")
    vendor = models.CharField(max_length=32, default="NVIDIA")
    aliases = ArrayField(models.CharField(max_length=100), default=list, blank=True)
    peak_tflops = models.JSONField(
        default=dict,
        help_text="Dense (no sparsity) peak TFLOP/s per dtype: fp64, fp64_tensor, tf32, bf16, fp16, fp8…",
    )
    memory_mib = models.PositiveIntegerField(
        null=True,
        blank=True,
        verbose_name="memory (MiB)",
        help_text="Capacity as the GPU reports it (nvidia-smi memory.total), e.g. 81559 for H100 80GB.",
    )
    bandwidth_tbps = models.FloatField(null=True, blank=True, verbose_name="memory bandwidth (TB/s)")
    sm_count = models.PositiveIntegerField(null=True, blank=True)
    tdp_w = models.FloatField(null=True, blank=True, verbose_name="TDP (W)")
    peak_clock_mhz = models.PositiveIntegerField(
        null=True,
        blank=True,
        verbose_name="peak clock (MHz)",
        help_text="SM clock the dense peaks assume (H100 SXM 1830); the MFU cross-check scales by it.",
    )
    max_clock_mhz = models.PositiveIntegerField(
        null=True,
        blank=True,
        verbose_name="max boost clock (MHz)",
        help_text="Maximum SM boost clock (H100 SXM 1980); throttling is judged against it.",
    )
    mamf_bf16_tflops = models.FloatField(
        null=True, blank=True, help_text="Measured best dense BF16 matmul (achievable ceiling), TFLOP/s."
    )
    single_source = models.BooleanField(
        default=False, help_text="Some figures rest on one source only: verify."
    )
    source = models.TextField(blank=True)

    class Meta:
        ordering = ["vendor", "name"]
        verbose_name = "GPU model"

    def __str__(self) -> str:
        return self.name

    def peak_flops(self, dtype: str) -> float | None:
        """Dense peak in FLOP/s for a dtype, or None when the catalog has no figure for it."""
        value = self.peak_tflops.get(dtype)
        return float(value) * 1e12 if value else None


class PriceEntry(models.Model):
    """USD per GPU-hour for a GPU model and tier, in force from `effective_from` until the next entry."""

    class Tier(models.TextChoices):
        ON_DEMAND = "on_demand", "On-demand"
        RESERVED = "reserved", "Reserved / committed"
        SPOT = "spot", "Spot"
        ON_PREM = "on_prem", "On-prem amortised"

    gpu_model = models.ForeignKey(GpuModel, on_delete=models.CASCADE, related_name="prices")
    tier = models.CharField(max_length=16, choices=Tier.choices)
    usd_per_gpu_hour = models.DecimalField(max_digits=10, decimal_places=4, validators=[MinValueValidator(0)])
    effective_from = models.DateTimeField()
    source = models.TextField(blank=True)

    class Meta:
        ordering = ["gpu_model", "tier", "-effective_from"]
        verbose_name_plural = "price entries"
        constraints = [
            models.UniqueConstraint(fields=["gpu_model", "tier", "effective_from"], name="price_entry_unique")
        ]

    def __str__(self) -> str:
        return (
            f"{self.gpu_model} {self.tier} ${self.usd_per_gpu_hour}/GPU-h from {self.effective_from:%Y-%m-%d}"
        )


class Job(models.Model):
    """A training job: who ran what model/config on which GPUs and when, plus its computed summary."""

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        ENDED = "ended", "Ended (finalizing)"
        FINALIZED = "finalized", "Finalized"

    class Kind(models.TextChoices):
        """What the job does; the diagnosis' advice and minimum evidence depend on it."""

        TRAINING = "training", "Training"
        FINE_TUNING = "fine_tuning", "Fine-tuning"
        INFERENCE = "inference", "Inference / serving"

    class Recompute(models.TextChoices):
        NONE = "none", "None"
        SELECTIVE = "selective", "Selective"
        FULL = "full", "Full"

    external_id = models.CharField(
        max_length=200, unique=True, help_text="The scheduler's id, e.g. a Slurm job id."
    )
    name = models.CharField(max_length=200, blank=True)
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="jobs")
    owner = models.CharField(max_length=150, blank=True, help_text="User name of the person who launched it.")
    model_name = models.CharField(max_length=200, blank=True)
    kind = models.CharField(
        max_length=16,
        choices=Kind.choices,
        default=Kind.TRAINING,
        help_text="training, fine_tuning or inference (serving): changes the diagnosis' advice.",
    )
    model_config = models.JSONField(
        default=dict,
        blank=True,
        help_text="n_params, n_layers, n_heads, head_dim, hidden, seq_len, vocab, active_params",
    )
    dtype = models.CharField(max_length=16, default="bf16")
    parallelism = models.JSONField(default=dict, blank=True, help_text="tp, pp, dp, ep")
    micro_batch = models.PositiveIntegerField(null=True, blank=True)
    global_batch = models.PositiveIntegerField(null=True, blank=True)
    recompute = models.CharField(max_length=16, choices=Recompute.choices, default=Recompute.NONE)
    gpu_model = models.ForeignKey(
        GpuModel, on_delete=models.PROTECT, null=True, blank=True, related_name="jobs"
    )
    gpu_model_name = models.CharField(
        max_length=200, blank=True, help_text="The name as reported; kept when it matches no catalog entry."
    )
    gpu_count = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    price_tier = models.CharField(max_length=16, choices=PriceEntry.Tier.choices, blank=True)
    tokens_per_step = models.PositiveBigIntegerField(null=True, blank=True)
    throughput_query = models.TextField(blank=True, help_text="PromQL giving tokens/s for this job.")
    gpus = models.JSONField(default=list, blank=True, help_text="[{hostname, gpu}] explicit GPU mapping")
    selector = models.JSONField(
        default=dict, blank=True, help_text="{label: value or regex} on exporter series"
    )
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    config_fingerprint = models.CharField(max_length=64, blank=True, db_index=True)

    # Ingestion state.
    last_polled_at = models.DateTimeField(null=True, blank=True)
    data_until = models.DateTimeField(null=True, blank=True, help_text="Series are archived up to here.")
    finalized_at = models.DateTimeField(null=True, blank=True)
    ingest_error = models.TextField(
        blank=True, help_text="Why the last poll failed; empty when data is fresh."
    )
    missing_signals = ArrayField(models.CharField(max_length=64), default=list, blank=True)

    # Summary, recomputed after each poll (null = not computable, never 0 by default).
    mfu = models.FloatField(null=True, blank=True)
    hfu = models.FloatField(null=True, blank=True)
    tokens_per_second = models.FloatField(null=True, blank=True)
    gpu_util_mean = models.FloatField(null=True, blank=True)
    sm_active_mean = models.FloatField(null=True, blank=True)
    tensor_active_mean = models.FloatField(null=True, blank=True)
    gpu_hours = models.FloatField(null=True, blank=True)
    cost_usd = models.FloatField(null=True, blank=True)
    cost_per_day_usd = models.FloatField(null=True, blank=True)
    waste_per_day_usd = models.FloatField(
        null=True, blank=True, help_text="Total waste $/day = max(idle, efficiency); null when MFU unknown."
    )
    waste_lower_bound_per_day_usd = models.FloatField(
        null=True,
        blank=True,
        help_text="What is certainly wasted, $/day: the total when known, else the idle part (see reason).",
    )
    idle_waste_per_day_usd = models.FloatField(
        null=True, blank=True, help_text="cost/day × share of observed GPU-time at ~0 % GPU_UTIL."
    )
    efficiency_waste_per_day_usd = models.FloatField(
        null=True, blank=True, help_text="cost/day × max(0, 1 − MFU ÷ reference MFU); null without MFU."
    )
    waste_unknown_reason = models.CharField(
        max_length=300, blank=True, help_text="Why the total waste is unknown; empty when it is known."
    )
    flops_variant = models.CharField(
        max_length=200, blank=True, help_text="FLOPs-per-token formula behind the MFU (e.g. 6N+12LHQT)."
    )
    mfu_fallback = models.BooleanField(
        default=False,
        help_text="MFU computed with a simpler formula than the organisation's convention (shape missing).",
    )
    util_coverage = models.FloatField(
        null=True,
        blank=True,
        help_text="Share of the GPU-time with GPU_UTIL samples (0-1); null = unknown. Shown when < 0.9.",
    )
    evaluation = models.JSONField(
        default=dict,
        blank=True,
        help_text="Typed evaluation (jobs.evaluation.schema.Evaluation), written by evaluation.store only.",
    )

    # Facts gathered by ingestion and artifact parsing, read by the evaluation (one writer each).
    energy_j = models.FloatField(
        null=True, blank=True, help_text="Increase of DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION over the job, J."
    )
    missing_reasons = models.JSONField(
        default=dict, blank=True, help_text="{signal key: why it is missing} from the last ingestion."
    )
    diagnosed_at = models.DateTimeField(null=True, blank=True, help_text="When the diagnosis last ran.")
    profiler_step_time_ms = models.FloatField(
        null=True, blank=True, help_text="Median step time of the latest parsed profiler trace, ms."
    )
    profiler_comm_share_pct = models.FloatField(
        null=True, blank=True, help_text="Share of the step in communication kernels, latest trace, %."
    )
    finalize_note = models.CharField(max_length=300, blank=True)
    discovered_by = models.CharField(
        max_length=300, blank=True, help_text="The label matcher a discovered job was registered from."
    )

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-started_at"]
        indexes = [
            models.Index(fields=["team", "started_at"]),
            models.Index(fields=["status", "started_at"]),
            models.Index(fields=["model_name"]),
            # Leaderboard and trend windows filter on both ends of a job; the job list sorts by these.
            models.Index(fields=["ended_at"], name="job_ended_at_idx"),
            models.Index(fields=["started_at"], name="job_started_at_idx"),
            models.Index(
                models.F("waste_per_day_usd").desc(nulls_last=True),
                models.F("started_at").desc(),
                name="job_waste_sort_idx",
            ),
            models.Index(
                models.F("mfu").desc(nulls_last=True), models.F("started_at").desc(), name="job_mfu_sort_idx"
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(ended_at__isnull=True) | Q(ended_at__gte=models.F("started_at")),
                name="job_ends_after_start",
            )
        ]

    def __str__(self) -> str:
        return self.name or self.external_id

    @property
    def is_running(self) -> bool:
        """True while the job has no end time."""
        return self.ended_at is None

    @property
    def evaluated(self) -> Evaluation | None:
        """The stored evaluation, decoded (None before the first one or after a schema change)."""
        return decode(self.evaluation)

    @property
    def waste_amount(self) -> Amount:
        """Waste $/day as every channel shows it: exact, "at least" the idle part, or unknown (reason)."""
        return Amount.of(
            self.waste_per_day_usd, self.waste_lower_bound_per_day_usd, self.waste_unknown_reason
        )

    def window_end(self) -> datetime:
        """End of the job's window: its end, or now while it runs."""
        return self.ended_at or timezone.now()


class ProgressSample(models.Model):
    """Pushed training progress: at `timestamp` the job had done `step` steps and `tokens` tokens in total."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="progress")
    timestamp = models.DateTimeField()
    step = models.PositiveBigIntegerField(null=True, blank=True)
    tokens = models.PositiveBigIntegerField()

    class Meta:
        ordering = ["job", "timestamp"]
        constraints = [models.UniqueConstraint(fields=["job", "timestamp"], name="progress_unique_ts")]

    def __str__(self) -> str:
        return f"{self.job_id} @ {self.timestamp:%Y-%m-%d %H:%M:%S}: {self.tokens} tokens"


class JobSeries(models.Model):
    """An archived chunk of one signal for one job, so pages work after Prometheus drops the data.

    `stat` is mean/min/max across the job's GPUs, or `gpu` with `gpu_key` naming one GPU (heatmaps).
    Compact (jobs.metrics.archive): the chunk starting at `start` (a multiple of 240 x step) holds the
    grid points start + step, ..., start + 240 x step as little-endian float32 `values`, no timestamps.
    Values are ratios 0-1 for utilisation signals; NaN marks a missing sample (never 0). One line may
    be archived at several steps (polled, finalized, downsampled tiers): the step is part of the key.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="series")
    signal = models.CharField(max_length=64)
    stat = models.CharField(max_length=32)
    gpu_key = models.CharField(max_length=200, blank=True)
    step_seconds = models.PositiveIntegerField()
    start = models.DateTimeField(help_text="chunk start: a multiple of 240 x step (exclusive)")
    end = models.DateTimeField(help_text="time of the chunk's last value")
    values = models.BinaryField(
        help_text="little-endian float32; value i is the grid point start + (i + 1) x step; NaN = no sample"
    )

    class Meta:
        verbose_name_plural = "job series"
        indexes = [models.Index(fields=["job", "signal", "stat", "start"])]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "signal", "stat", "gpu_key", "step_seconds", "start"],
                name="series_chunk_unique",
            )
        ]

    def __str__(self) -> str:
        gpu = f"/{self.gpu_key}" if self.gpu_key else ""
        return f"{self.signal}/{self.stat}{gpu} from {self.start:%Y-%m-%d %H:%M}"

    def points(self) -> tuple[list[float], list[float]]:
        """The chunk's grid points (Unix s) and values (float, NaN = no sample), decoded."""
        import numpy as np  # only here: the model module stays light for everything else

        vals = np.frombuffer(bytes(self.values), dtype="<f4").astype(np.float64)
        times = self.start.timestamp() + self.step_seconds * np.arange(1, vals.size + 1, dtype=np.float64)
        return times.tolist(), vals.tolist()


class Baseline(models.Model):
    """Healthy reference for a model + config fingerprint: robust statistics over one or more runs."""

    fingerprint = models.CharField(max_length=64, db_index=True)
    model_name = models.CharField(max_length=200)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="baselines")
    config = models.JSONField(
        default=dict, help_text="The canonical config the fingerprint was computed from."
    )
    runs = models.ManyToManyField(Job, related_name="baselines", blank=True)
    stats = models.JSONField(default=dict, help_text="metric -> {median, mad, iqr, n, min, max}")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["model_name", "-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["fingerprint"],
                condition=Q(retired_at__isnull=True),
                name="one_active_baseline_per_fingerprint",
            )
        ]

    def __str__(self) -> str:
        return f"{self.model_name} [{self.fingerprint[:8]}]"


class PromotionOverride(models.Model):
    """A run promoted to a baseline although it had warning-or-worse hardware/health findings: who, when,
    which findings (their codes) and the reason they gave. The audit trail of "promote anyway"."""

    baseline = models.ForeignKey(Baseline, on_delete=models.CASCADE, related_name="overrides")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="promotion_overrides")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    finding_codes = ArrayField(models.CharField(max_length=64), default=list)
    reason = models.CharField(max_length=500)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.job} into {self.baseline}: {self.reason[:40]}"


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


class Finding(models.Model):
    """A diagnosis of one job: a stable code, its evidence and windows, the fix, and the $/day it explains."""

    class Severity(models.TextChoices):
        INFO = "info", "Info"
        WARNING = "warning", "Warning"
        CRITICAL = "critical", "Critical"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="findings")
    code = models.CharField(max_length=64)
    severity = models.CharField(max_length=16, choices=Severity.choices)
    confidence = models.FloatField(validators=[MinValueValidator(0), MaxValueValidator(1)])
    title = models.CharField(max_length=300)
    window_start = models.DateTimeField(null=True, blank=True)
    window_end = models.DateTimeField(null=True, blank=True)
    windows = models.JSONField(default=list, blank=True, help_text="[[start_unix, end_unix], ...]")
    evidence = models.JSONField(default=list, help_text="[{label, value, unit}] numbers behind the finding")
    recommendation = models.TextField()
    waste_per_day_usd = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="$/day this cause explains; null = impact unknown (the job's waste is unknown), never 0.",
    )
    missing_signals = ArrayField(models.CharField(max_length=64), default=list, blank=True)
    first_seen_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = [models.F("waste_per_day_usd").desc(nulls_last=True), "code"]
        constraints = [models.UniqueConstraint(fields=["job", "code"], name="finding_unique_per_job_code")]

    def __str__(self) -> str:
        return f"{self.code} on {self.job}"


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
        KUBERNETES = "kubernetes", "Kubernetes: delete the pod"

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
