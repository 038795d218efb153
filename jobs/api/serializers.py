"""Serializers of the REST API: job registration (idempotent), progress, summaries."""

from __future__ import annotations

import re
from typing import Any

from rest_framework import serializers

from jobs.models import Baseline, Finding, Job, PriceEntry, ProgressSample, Team

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_DTYPES = ("bf16", "fp16", "fp32", "tf32", "fp8", "int8", "fp64")
_DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}


class ModelConfigSerializer(serializers.Serializer):
    """The model's shape, as needed for FLOPs per token (reference/formulas.md)."""

    name = serializers.CharField(max_length=200)
    n_params = serializers.FloatField(min_value=1, required=False, help_text="Non-embedding parameters N")
    active_params = serializers.FloatField(
        min_value=1, required=False, help_text="MoE: active parameters per token"
    )
    n_layers = serializers.IntegerField(min_value=1, required=False)
    n_heads = serializers.IntegerField(min_value=1, required=False)
    head_dim = serializers.IntegerField(min_value=1, required=False)
    hidden = serializers.IntegerField(min_value=1, required=False)
    seq_len = serializers.IntegerField(min_value=1, required=False)
    vocab = serializers.IntegerField(min_value=1, required=False)


class ParallelismSerializer(serializers.Serializer):
    """Tensor, pipeline, data and expert parallel degrees."""

    tp = serializers.IntegerField(min_value=1, default=1)
    pp = serializers.IntegerField(min_value=1, default=1)
    dp = serializers.IntegerField(min_value=1, default=1)
    ep = serializers.IntegerField(min_value=1, default=1)


class GpuRefSerializer(serializers.Serializer):
    """One GPU of a job: host and index (or UUID)."""

    hostname = serializers.CharField(max_length=253)
    gpu = serializers.CharField(max_length=64, help_text="GPU index as dcgm-exporter labels it, or a UUID")


class JobRegisterSerializer(serializers.Serializer):
    """Body of POST /api/v1/jobs/: register (or re-register, idempotently) a job."""

    external_id = serializers.CharField(max_length=200)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    team = serializers.SlugRelatedField(slug_field="slug", queryset=Team.objects.all())
    owner = serializers.CharField(max_length=150, required=False, allow_blank=True, default="")
    model = ModelConfigSerializer()
    kind = serializers.ChoiceField(
        choices=Job.Kind.choices,
        default=Job.Kind.TRAINING,
        help_text="training, fine_tuning or inference (serving); the diagnosis' advice depends on it",
    )
    dtype = serializers.CharField(max_length=16, default="bf16")
    parallelism = ParallelismSerializer(required=False)
    micro_batch = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    global_batch = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    recompute = serializers.ChoiceField(choices=Job.Recompute.choices, default=Job.Recompute.NONE)
    gpu_model = serializers.CharField(max_length=200, help_text="e.g. 'NVIDIA H100 80GB HBM3'")
    gpu_count = serializers.IntegerField(min_value=1, required=False)
    price_tier = serializers.ChoiceField(choices=PriceEntry.Tier.choices, required=False, allow_blank=True)
    tokens_per_step = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    throughput_query = serializers.CharField(required=False, allow_blank=True, default="", max_length=4000)
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
        dtype = _DTYPE_ALIASES.get(value.lower(), value.lower())
        if dtype not in _DTYPES:
            raise serializers.ValidationError(f"unknown dtype {value!r}; use one of {', '.join(_DTYPES)}")
        return dtype

    def validate_selector(self, value: dict[str, Any]) -> dict[str, Any]:
        for label, matcher in value.items():
            if not _LABEL_NAME.match(label):
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
            if isinstance(matcher, dict):
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise serializers.ValidationError(f"{label}: invalid regex: {exc}") from None
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        gpus, selector = attrs.get("gpus"), attrs.get("selector")
        if bool(gpus) == bool(selector):
            raise serializers.ValidationError(
                "give exactly one of 'gpus' (explicit mapping) or 'selector' (labels)"
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
        return attrs


class JobEndSerializer(serializers.Serializer):
    """Body of PATCH /api/v1/jobs/{external_id}/: end a job, or correct fields."""

    ended_at = serializers.DateTimeField(required=False, allow_null=True)
    name = serializers.CharField(max_length=200, required=False)
    kind = serializers.ChoiceField(choices=Job.Kind.choices, required=False)
    tokens_per_step = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    throughput_query = serializers.CharField(required=False, allow_blank=True, max_length=4000)
    price_tier = serializers.ChoiceField(choices=PriceEntry.Tier.choices, required=False, allow_blank=True)


class ProgressSerializer(serializers.Serializer):
    """One progress point: cumulative step and tokens at a time."""

    timestamp = serializers.DateTimeField()
    step = serializers.IntegerField(min_value=0, required=False, allow_null=True)
    tokens = serializers.IntegerField(min_value=0)


class FindingSerializer(serializers.ModelSerializer):
    """A diagnosis finding as served under a job."""

    class Meta:
        model = Finding
        fields = [
            "code",
            "severity",
            "confidence",
            "title",
            "window_start",
            "window_end",
            "windows",
            "evidence",
            "recommendation",
            "waste_per_day_usd",
            "missing_signals",
            "updated_at",
        ]


class ProgressSampleSerializer(serializers.ModelSerializer):
    """A stored progress point."""

    class Meta:
        model = ProgressSample
        fields = ["timestamp", "step", "tokens"]


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
