"""Serializers of the REST API: job registration (idempotent), progress, summaries."""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Any

from django.conf import settings
from rest_framework import serializers

from jobs.api.parsers import text_problem
from jobs.evaluation.catalog import DTYPES, normalise_dtype
from jobs.intake.registry import check_moment, check_window
from jobs.metrics.promql import MAX_ALTERNATIVES, count_label_alternatives
from jobs.metrics.throughput import TemplateError, mark_free_form, validate_template
from jobs.models import Baseline, Job, PriceEntry, Team

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# Column ranges: PositiveIntegerField is a Postgres integer, PositiveBigIntegerField a bigint.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
MAX_PARAMS = 1e15  # a thousand times today's largest models; beyond it the number is a typo
MAX_SELECTOR_LABELS = 8


def _no_control_characters(value: str) -> None:
    if problem := text_problem(value):
        raise serializers.ValidationError(problem)


class StrictCharField(serializers.CharField):
    """A CharField that also refuses control characters (DRF already refuses NUL and lone surrogates)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validators.append(_no_control_characters)


class FiniteFloatField(serializers.FloatField):
    """A FloatField that refuses NaN and infinities ("nan", "inf", 1e309), with the bounds in the message."""

    def to_internal_value(self, data: Any) -> float:
        value = super().to_internal_value(data)
        if not math.isfinite(value):
            raise serializers.ValidationError("must be a finite number")
        return value


_THROUGHPUT_HELP = (
    "PromQL template for tokens/s reading only the job's series: every metric written metric{$job}, "
    "e.g. sum(rate(train_tokens_total{$job}[5m])); $job expands to the selector's exact labels, or "
    'job_id="<external_id>" for explicit GPUs. Staff may set free-form PromQL (throughput_query_free_form).'
)
_FREE_FORM_HELP = "staff only: store throughput_query as free-form PromQL, run as written"


def clean_throughput(attrs: dict[str, Any]) -> None:
    """Validate `throughput_query` as a template (THROUGHPUT_MAX_LOOKBACK_S), or mark it free-form when
    `throughput_query_free_form` asks (the view refuses that flag to non-staff)."""
    query = attrs.get("throughput_query")
    if not query:
        return
    if attrs.get("throughput_query_free_form"):
        attrs["throughput_query"] = mark_free_form(query)
        return
    try:
        attrs["throughput_query"] = validate_template(
            query, max_lookback_s=settings.THROUGHPUT_MAX_LOOKBACK_S
        )
    except TemplateError as exc:
        raise serializers.ValidationError({"throughput_query": str(exc)}) from None


def bounded_int(max_value: int = INT32_MAX, **kwargs: Any) -> serializers.IntegerField:
    """An IntegerField within a database column's range (the bound is in DRF's message)."""
    return serializers.IntegerField(max_value=max_value, **kwargs)


class ModelConfigSerializer(serializers.Serializer):
    """The model's shape, as needed for FLOPs per token (reference/formulas.md)."""

    name = StrictCharField(max_length=200)
    n_params = FiniteFloatField(
        min_value=1, max_value=MAX_PARAMS, required=False, help_text="Non-embedding parameters N"
    )
    active_params = FiniteFloatField(
        min_value=1, max_value=MAX_PARAMS, required=False, help_text="MoE: active parameters per token"
    )
    n_layers = bounded_int(min_value=1, required=False)
    n_heads = bounded_int(min_value=1, required=False)
    head_dim = bounded_int(min_value=1, required=False)
    hidden = bounded_int(min_value=1, required=False)
    seq_len = bounded_int(min_value=1, required=False)
    vocab = bounded_int(min_value=1, required=False)


class ParallelismSerializer(serializers.Serializer):
    """Tensor, pipeline, data and expert parallel degrees."""

    tp = bounded_int(min_value=1, default=1)
    pp = bounded_int(min_value=1, default=1)
    dp = bounded_int(min_value=1, default=1)
    ep = bounded_int(min_value=1, default=1)


class GpuRefSerializer(serializers.Serializer):
    """One GPU of a job: host and index (or UUID)."""

    hostname = StrictCharField(max_length=253)
    gpu = StrictCharField(max_length=64, help_text="GPU index as dcgm-exporter labels it, or a UUID")


class JobRegisterSerializer(serializers.Serializer):
    """Body of POST /api/v1/jobs/: register (or re-register, idempotently) a job."""

    external_id = StrictCharField(max_length=200)
    name = StrictCharField(max_length=200, required=False, allow_blank=True, default="")
    team = serializers.SlugRelatedField(slug_field="slug", queryset=Team.objects.all())
    owner = StrictCharField(
        max_length=150,
        required=False,
        allow_blank=True,
        default="",
        help_text="User name of who launched it; a member may name only a member of the job's team",
    )
    cluster = StrictCharField(
        max_length=100,
        required=False,
        allow_blank=True,
        default="",
        help_text="The scheduler cluster: set by a scheduler credential (its own cluster), never by a member",
    )
    model = ModelConfigSerializer()
    kind = serializers.ChoiceField(
        choices=Job.Kind.choices,
        default=Job.Kind.TRAINING,
        help_text="training, fine_tuning or inference (serving); the diagnosis' advice depends on it",
    )
    dtype = StrictCharField(
        max_length=16,
        default="bf16",
        help_text="bf16, fp16, fp32, tf32, fp8, int8, fp64 or fp64_tensor, or an alias (bf16-mixed, "
        "torch.bfloat16, half); stored as the canonical key",
    )
    parallelism = ParallelismSerializer(required=False)
    micro_batch = bounded_int(min_value=1, required=False, allow_null=True)
    global_batch = bounded_int(min_value=1, required=False, allow_null=True)
    recompute = serializers.ChoiceField(choices=Job.Recompute.choices, default=Job.Recompute.NONE)
    gpu_model = StrictCharField(max_length=200, help_text="e.g. 'NVIDIA H100 80GB HBM3'")
    gpu_count = bounded_int(min_value=1, required=False)
    price_tier = serializers.ChoiceField(choices=PriceEntry.Tier.choices, required=False, allow_blank=True)
    tokens_per_step = bounded_int(INT64_MAX, min_value=1, required=False, allow_null=True)
    throughput_query = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=4000, help_text=_THROUGHPUT_HELP
    )
    throughput_query_free_form = serializers.BooleanField(
        required=False, default=False, help_text=_FREE_FORM_HELP
    )
    started_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(required=False, allow_null=True)
    gpus = GpuRefSerializer(many=True, required=False)
    selector = serializers.DictField(
        child=serializers.JSONField(),
        required=False,
        help_text='{label: "exact value"} or {label: {"regex": "pretrain-7b-.*"}} on the exporter series',
    )

    def validate_external_id(self, value: str) -> str:
        if "/" in value or not value.strip():
            raise serializers.ValidationError("must be non-empty and contain no '/'")
        return value.strip()

    def validate_dtype(self, value: str) -> str:
        # The catalog's one dtype table: aliases such as "bf16-mixed" or "torch.bfloat16" are stored as
        # the canonical key, so the peak lookup, the FP8 target and the rules all see the same value.
        dtype = normalise_dtype(value)
        if dtype is None:
            raise serializers.ValidationError(
                f"unknown dtype {value!r}; use one of {', '.join(DTYPES)} (or an alias such as bf16-mixed, "
                "torch.bfloat16, half)"
            )
        return dtype

    def validate_started_at(self, value: datetime) -> datetime:
        if problem := check_moment(value):
            raise serializers.ValidationError(problem)
        return value

    def validate_ended_at(self, value: datetime | None) -> datetime | None:
        if problem := check_moment(value):
            raise serializers.ValidationError(problem)
        return value

    def validate_selector(self, value: dict[str, Any]) -> dict[str, Any]:
        if len(value) > MAX_SELECTOR_LABELS:
            raise serializers.ValidationError(
                f"{len(value)} labels; a selector has at most {MAX_SELECTOR_LABELS} labels"
            )
        for label, matcher in value.items():
            if not _LABEL_NAME.fullmatch(label):
                raise serializers.ValidationError(f"{label!r} is not a valid Prometheus label name")
            pattern = (
                matcher.get("regex") if isinstance(matcher, dict) and set(matcher) == {"regex"} else None
            )
            if isinstance(matcher, str):
                pattern = matcher
            if not isinstance(pattern, str) or not pattern or len(pattern) > 500:
                raise serializers.ValidationError(
                    f'{label}: use a non-empty string (exact match) or {{"regex": "..."}} (at most 500 chars)'
                )
            if problem := text_problem(pattern):
                raise serializers.ValidationError(f"{label}: the value {problem}")
            if isinstance(matcher, dict):
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise serializers.ValidationError(f"{label}: invalid regex: {exc}") from None
        alternatives = count_label_alternatives(value)  # arithmetic: nothing is built
        if alternatives > MAX_ALTERNATIVES:
            raise serializers.ValidationError(
                f"these {len(value)} labels expand to {alternatives} alternatives over the label spellings "
                f"dcgm-exporter and Prometheus use (at most {MAX_ALTERNATIVES}); use fewer labels"
            )
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        gpus, selector = attrs.get("gpus"), attrs.get("selector")
        if bool(gpus) == bool(selector):
            raise serializers.ValidationError(
                "give exactly one of 'gpus' (explicit mapping) or 'selector' (labels)"
            )
        if gpus and len(gpus) > settings.MAX_JOB_GPUS:
            raise serializers.ValidationError(
                {"gpus": f"{len(gpus)} GPUs listed; at most {settings.MAX_JOB_GPUS} (MAX_JOB_GPUS)"}
            )
        if gpus:
            keys = {(g["hostname"], g["gpu"]) for g in gpus}
            if len(keys) != len(gpus):
                raise serializers.ValidationError({"gpus": "the same GPU is listed twice"})
            if attrs.get("gpu_count") not in (None, len(gpus)):
                raise serializers.ValidationError(
                    {"gpu_count": f"is {attrs['gpu_count']} but {len(gpus)} GPUs listed"}
                )
            attrs["gpu_count"] = len(gpus)
        elif attrs.get("gpu_count") is None:
            raise serializers.ValidationError({"gpu_count": "required with a selector"})
        ended = attrs.get("ended_at")
        if ended is not None and ended < attrs["started_at"]:
            raise serializers.ValidationError({"ended_at": "is before started_at"})
        if problem := check_window(attrs["started_at"], ended):
            raise serializers.ValidationError({"started_at": problem})
        clean_throughput(attrs)
        return attrs


class JobEndSerializer(serializers.Serializer):
    """Body of PATCH /api/v1/jobs/{external_id}/: end a job, or correct fields."""

    ended_at = serializers.DateTimeField(required=False, allow_null=True)
    name = StrictCharField(max_length=200, required=False)
    kind = serializers.ChoiceField(choices=Job.Kind.choices, required=False)
    tokens_per_step = bounded_int(INT64_MAX, min_value=1, required=False, allow_null=True)
    throughput_query = serializers.CharField(
        required=False, allow_blank=True, max_length=4000, help_text=_THROUGHPUT_HELP
    )
    throughput_query_free_form = serializers.BooleanField(required=False, help_text=_FREE_FORM_HELP)
    price_tier = serializers.ChoiceField(choices=PriceEntry.Tier.choices, required=False, allow_blank=True)

    def validate_ended_at(self, value: datetime | None) -> datetime | None:
        if problem := check_moment(value):
            raise serializers.ValidationError(problem)
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        clean_throughput(attrs)
        return attrs


class ProgressSerializer(serializers.Serializer):
    """One progress point: cumulative step and tokens at a time."""

    timestamp = serializers.DateTimeField()
    step = bounded_int(INT64_MAX, min_value=0, required=False, allow_null=True)
    tokens = bounded_int(INT64_MAX, min_value=0)

    def validate_timestamp(self, value: datetime) -> datetime:
        if problem := check_moment(value):
            raise serializers.ValidationError(problem)
        return value


class BaselineSerializer(serializers.ModelSerializer):
    """A baseline with its robust statistics."""

    team: serializers.SlugRelatedField[Team] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    runs: serializers.SlugRelatedField[Job] = serializers.SlugRelatedField(
        slug_field="external_id", many=True, read_only=True
    )
    active = serializers.SerializerMethodField()

    class Meta:
        model = Baseline
        fields = [
            "id",
            "fingerprint",
            "model_name",
            "team",
            "config",
            "runs",
            "stats",
            "active",
            "created_at",
            "retired_at",
        ]

    def get_active(self, obj: Baseline) -> bool:
        return obj.retired_at is None
