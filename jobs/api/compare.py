"""GET /api/v1/jobs/compare/?a=<external_id>&b=<external_id>: the comparison page's content as JSON (one
builder for both: jobs.outputs.compare_data.build). Read policy as for jobs (jobs.access.permissions)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.outputs.compare_data import CompareError, build, get_pair


class SignificanceSerializer(serializers.Serializer):
    """Whether B − A is beyond run-to-run noise (jobs.outputs.compare.significance)."""

    verdict = serializers.ChoiceField(
        choices=[
            "better",
            "worse",
            "changed",
            "within noise",
            "not assessed",
            "unknown",
            "not measured",
            "not judged",
        ],
        help_text="not measured: computed from price, MFU and idle share (dollars); not judged: a measured "
        "or counted total (energy, GPU-hours), one value per run with no spread to judge a change against",
    )
    method = serializers.ChoiceField(
        choices=["baseline", "samples", "none"],
        help_text="baseline: the baseline's spread over its runs; samples: batch means of the runs' samples",
    )
    detail = serializers.CharField()
    sigma = serializers.FloatField(help_text="noise σ in the KPI's unit", allow_null=True, required=False)
    band_half_width = serializers.FloatField(help_text="max(3 σ, 5 % of A)", allow_null=True, required=False)
    robust_z = serializers.FloatField(help_text="(B − A) / σ", allow_null=True, required=False)
    beyond_noise = serializers.BooleanField(allow_null=True)


class KpiRowSerializer(serializers.Serializer):
    """One KPI of both runs; null = unknown (see the reason), never 0."""

    key = serializers.CharField()
    label = serializers.CharField()  # type: ignore[assignment]  # a field named like Field.label
    unit = serializers.CharField(
        help_text="ratio (0-1), tokens/s, ms, W, MHz, B/s, MiB, usd/day, usd, kWh, ..."
    )
    definition = serializers.CharField()
    direction = serializers.ChoiceField(choices=["higher", "lower", "neutral"])
    a = serializers.FloatField(allow_null=True, required=False)
    b = serializers.FloatField(allow_null=True, required=False)
    a_lower_bound = serializers.BooleanField(help_text="A's value is 'at least' (waste without MFU)")
    b_lower_bound = serializers.BooleanField()
    a_reason = serializers.CharField(allow_blank=True)
    b_reason = serializers.CharField(allow_blank=True)
    a_text = serializers.CharField(help_text="as the page prints it")
    b_text = serializers.CharField()
    delta = serializers.FloatField(
        help_text="B − A; null when either is unknown or a lower bound", allow_null=True, required=False
    )
    delta_pct = serializers.FloatField(help_text="(B − A) ÷ |A| × 100", allow_null=True, required=False)
    delta_text = serializers.CharField()
    significance = SignificanceSerializer()


class RunSerializer(serializers.Serializer):
    """One of the two jobs."""

    external_id = serializers.CharField()
    name = serializers.CharField(allow_blank=True)
    team = serializers.CharField()
    model_name = serializers.CharField(allow_blank=True)
    status = serializers.CharField()
    started_at = serializers.CharField()
    ended_at = serializers.CharField(allow_null=True)
    gpu_model = serializers.CharField(allow_null=True)
    gpu_count = serializers.IntegerField()
    dtype = serializers.CharField()
    config_fingerprint = serializers.CharField(allow_blank=True)
    flops_variant = serializers.CharField(allow_null=True)
    mfu_fallback = serializers.BooleanField()
    evaluated = serializers.BooleanField()


class ConfigRowSerializer(serializers.Serializer):
    field = serializers.CharField()
    label = serializers.CharField()  # type: ignore[assignment]  # a field named like Field.label
    a = serializers.CharField()
    b = serializers.CharField()
    changed = serializers.BooleanField()


class ConfigDiffSerializer(serializers.Serializer):
    """Fingerprint fields side by side; warnings when the runs are not like for like."""

    rows = ConfigRowSerializer(many=True)
    changed = serializers.ListField(child=serializers.CharField())
    comparable = serializers.BooleanField()
    warnings = serializers.ListField(child=serializers.CharField())
    notes = serializers.ListField(child=serializers.CharField())


class FindingItemSerializer(serializers.Serializer):
    code = serializers.CharField()
    title = serializers.CharField()
    severity_a = serializers.CharField(allow_null=True)
    severity_b = serializers.CharField(allow_null=True)
    a_usd_per_day = serializers.FloatField(
        help_text="null: not in A, or impact unknown", allow_null=True, required=False
    )
    b_usd_per_day = serializers.FloatField(allow_null=True, required=False)
    a_text = serializers.CharField()
    b_text = serializers.CharField()
    delta_usd_per_day = serializers.FloatField(allow_null=True, required=False)
    delta_text = serializers.CharField(allow_blank=True)


class FindingTotalSerializer(serializers.Serializer):
    usd_per_day = serializers.FloatField(
        help_text="sum of the known dollars", allow_null=True, required=False
    )
    unknown = serializers.IntegerField(help_text="findings of unknown impact, not counted")
    text = serializers.CharField()


class FindingTotalsSerializer(serializers.Serializer):
    resolved = FindingTotalSerializer()
    new = FindingTotalSerializer()
    persisting_a = FindingTotalSerializer()
    persisting_b = FindingTotalSerializer()


class FindingsDiffSerializer(serializers.Serializer):
    """Findings by code: resolved (A only), new (B only), persisting (both), with $/day."""

    resolved = FindingItemSerializer(many=True)
    new = FindingItemSerializer(many=True)
    persisting = FindingItemSerializer(many=True)
    totals = FindingTotalsSerializer()


class PerGpuSerializer(serializers.Serializer):
    """Per-GPU time-means of one ratio signal and the straggler candidates (below the peers' band)."""

    signal = serializers.CharField()
    gpus = serializers.IntegerField()
    available = serializers.BooleanField()
    median = serializers.FloatField(allow_null=True, required=False)
    lowest = serializers.DictField(required=False)
    highest = serializers.DictField(required=False)
    spread = serializers.FloatField(allow_null=True, required=False)
    stragglers = serializers.ListField(child=serializers.DictField(), required=False)
    text = serializers.CharField(required=False)


class PerGpuPairSerializer(serializers.Serializer):
    a = PerGpuSerializer()
    b = PerGpuSerializer()


class TraceDiffSerializer(serializers.Serializer):
    """B − A of two trace analyses of one kind (HTA's definitions); `available` false with a reason
    when the runs have no traces of the same kind. Sections are lists of {key, label, unit, a, b, delta}."""

    available = serializers.BooleanField()
    reason = serializers.CharField(required=False)
    kind = serializers.CharField(required=False)
    a = serializers.DictField(required=False)
    b = serializers.DictField(required=False)
    temporal = serializers.ListField(child=serializers.DictField(), required=False)
    idle = serializers.ListField(child=serializers.DictField(), required=False)
    step = serializers.ListField(child=serializers.DictField(), required=False)
    gpu_idle_attribution = serializers.ListField(child=serializers.DictField(), required=False)
    kernel_classes = serializers.ListField(child=serializers.DictField(), required=False)
    kernels = serializers.DictField(required=False, help_text="rows (top 20 by |Δ time|), listed/distinct")
    launch = serializers.ListField(child=serializers.DictField(), required=False)
    host_blocking = serializers.ListField(child=serializers.DictField(), required=False)
    host_blocking_kinds = serializers.ListField(child=serializers.DictField(), required=False)
    overlap = serializers.ListField(child=serializers.DictField(), required=False)
    notes = serializers.ListField(child=serializers.CharField(), required=False)


class ComparisonSerializer(serializers.Serializer):
    """Two runs compared: A is "before", B "after"; every change is B − A."""

    a = RunSerializer()
    b = RunSerializer()
    before = serializers.CharField()
    after = serializers.CharField()
    delta = serializers.CharField()
    notes = serializers.ListField(child=serializers.CharField())
    mfu_convention = serializers.CharField()
    config = ConfigDiffSerializer()
    baseline = serializers.DictField(allow_null=True, help_text="the baseline whose spread is the noise")
    kpis = KpiRowSerializer(many=True)
    findings = FindingsDiffSerializer()
    per_gpu = PerGpuPairSerializer()
    traces = TraceDiffSerializer()


class _Error(serializers.Serializer):
    detail = serializers.CharField()


class JobCompareView(APIView):
    """Two jobs compared (the comparison page's numbers)."""

    permission_classes = [IsAuthenticated]

    @extend_schema(
        operation_id="jobs_compare",
        parameters=[
            OpenApiParameter("a", str, required=True, description="external id of run A (before)"),
            OpenApiParameter("b", str, required=True, description="external id of run B (after)"),
        ],
        responses={
            200: ComparisonSerializer,
            400: OpenApiResponse(_Error, description="a or b missing, or the same job twice"),
            404: OpenApiResponse(_Error, description="no job with that external id (named)"),
        },
    )
    def get(self, request: Request) -> Response:
        """A against B: config diff, KPIs with significance, findings diff, per-GPU, trace diff."""
        try:
            a, b = get_pair(request.query_params.get("a"), request.query_params.get("b"), request.user)
        except CompareError as exc:
            return Response({"detail": exc.message}, status=exc.status)
        return Response(build(a, b).comparison)
