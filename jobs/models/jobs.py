"""Jobs with their archived series, pushed progress, findings and baselines (with promotion overrides)."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from jobs.evaluation.costs import Amount
from jobs.evaluation.schema import Evaluation, decode
from jobs.models.catalog import GpuModel, PriceEntry
from jobs.models.teams import Team


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
        #: Nobody said (a discovered job, a scheduler that does not know): the diagnosis shows no cause whose
        #: reading depends on the kind above info (jobs.diagnosis.kinds).
        UNKNOWN = "unknown", "Unknown"

    class Recompute(models.TextChoices):
        NONE = "none", "None"
        SELECTIVE = "selective", "Selective"
        FULL = "full", "Full"

    class Provenance(models.TextChoices):
        """Who registered the job (jobs.access.ownership: what each may claim, what may be done to the
        job)."""

        MEMBER = "member", "Team member (by hand)"
        SCHEDULER = "scheduler", "Scheduler integration (service credential)"
        DISCOVERY = "discovery", "Discovery (exporter label)"
        STAFF = "staff", "Staff"
        IMPORT = "import", "Import (management command)"
        DEMO = "demo", "Demo data"

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
        help_text="training, fine_tuning, inference (serving) or unknown: changes the diagnosis' readings "
        "and advice.",
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

    # Provenance, written by the registry only (jobs.intake.registry via jobs.access.ownership): who vouches
    # for the job's
    # identity, GPUs and selector. Only `scheduler` jobs may be cancelled by the idle-GPU policy.
    registered_by = models.CharField(
        max_length=16,
        choices=Provenance.choices,
        default=Provenance.MEMBER,
        help_text="Who registered the job: a team member by hand, a scheduler credential, discovery, staff.",
    )
    cluster = models.CharField(
        max_length=100, blank=True, help_text="The scheduler cluster whose credential registered the job."
    )
    registered_via = models.CharField(
        max_length=200,
        blank=True,
        help_text="The credential (token name and prefix) or user that registered it.",
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
    """A team's healthy reference for a model + config fingerprint: robust statistics over one or more of
    its runs. Team-scoped: another team with the same fingerprint has its own (jobs.evaluation.baselines)."""

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
                fields=["team", "fingerprint"],
                condition=Q(retired_at__isnull=True),
                name="one_active_baseline_per_team_fingerprint",
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


#: The one order of a job's findings in SQL, equal to `jobs.diagnosis.base.rank_key` (a unit test holds them
#: equal): specific causes before the unexplained remainder ("unexplained_waste", shown as a footer line),
#: most $/day first (unknown last), then critical > warning > info, then the more confident, then the code.
#: The catch-all finding's code (jobs.diagnosis.base.REMAINDER_CODE; the models sit below the diagnosis).
REMAINDER_CODE = "unexplained_waste"
FINDING_RANK_ORDER = [
    models.Case(models.When(code=REMAINDER_CODE, then=models.Value(1)), default=models.Value(0)).asc(),
    models.F("waste_per_day_usd").desc(nulls_last=True),
    models.Case(
        models.When(severity="critical", then=models.Value(2)),
        models.When(severity="warning", then=models.Value(1)),
        default=models.Value(0),
    ).desc(),
    models.F("confidence").desc(),
    models.F("code").asc(),
]


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
        ordering = FINDING_RANK_ORDER
        constraints = [models.UniqueConstraint(fields=["job", "code"], name="finding_unique_per_job_code")]

    def __str__(self) -> str:
        return f"{self.code} on {self.job}"
