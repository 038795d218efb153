"""REST endpoints under /api/v1/: jobs (register, update, end, summary), progress, baselines."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, NotFound, PermissionDenied, ValidationError
from rest_framework.parsers import MultiPartParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from jobs.access.ownership import Claimant, OwnershipError, scheduler_jobs
from jobs.access.permissions import (
    is_staff,
    readable_job_or_404,
    readable_jobs,
    readable_team_ids,
    scope_to_teams,
)
from jobs.api.auth import TeamScopedWrite
from jobs.api.pagination import BoundedLimitOffsetPagination
from jobs.api.serializers import (
    INT32_MAX,
    BaselineSerializer,
    JobEndSerializer,
    JobRegisterSerializer,
    ProgressSerializer,
)
from jobs.evaluation.baselines import (
    OVERRIDE_REASON_MAX,
    BaselineError,
    PromotionForbidden,
    UnhealthyRun,
    promote,
    retire,
)
from jobs.intake.artifact_review import Review, ReviewError, review_artifact
from jobs.intake.artifacts import UploadError, requeue, store_upload
from jobs.intake.registry import RegistryConflict, RegistryError, record_progress, register_job, update_job
from jobs.intake.uploads import UploadRefusal, authorise_upload, install_upload_limit, upload_refused
from jobs.models import Artifact, Baseline, Job
from jobs.outputs.summary import job_summary, summary_queryset
from jobs.views.filters import JOB_FILTER_HELP, BaselineFilterSet, job_filterset

_SUMMARY = inline_serializer("JobSummary", fields={"external_id": serializers.CharField()})


class Conflict(APIException):
    """409: the request contradicts what is stored, or itself."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "conflicts with the stored state"
    default_code = "conflict"


class ArtifactUploadSerializer(serializers.Serializer):
    """Multipart body of an artifact upload."""

    file = serializers.FileField()
    kind = serializers.ChoiceField(
        choices=Artifact.Kind.choices, required=False, help_text="auto-detected if omitted"
    )
    rank = serializers.IntegerField(min_value=0, max_value=INT32_MAX, required=False, allow_null=True)
    timezone = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=64,
        help_text="zone of a monitoring log's local timestamps (nvidia-smi, dstat print the host's local "
        "time): an IANA name such as Europe/Berlin, UTC, or an offset such as +02:00; UTC if omitted",
    )


class ArtifactSerializer(serializers.ModelSerializer):
    """An artifact with its parse status and, once done, its analysis."""

    job: serializers.SlugRelatedField[Job] = serializers.SlugRelatedField(
        slug_field="external_id", read_only=True
    )

    class Meta:
        model = Artifact
        fields = ["id", "job", "kind", "rank", "original_name", "sha256", "size_bytes", "status", "error",
                  "uploaded_at", "parsed_at", "run_check", "run_mismatches", "confirmed_at", "excluded_at",
                  "analysis"]  # fmt: skip


class ArtifactReviewSerializer(serializers.Serializer):
    """Body of POST /api/v1/artifacts/{id}/review/."""

    action = serializers.ChoiceField(choices=[r.value for r in Review])


class JobArtifactsMixin:
    """POST/GET /api/v1/jobs/{external_id}/artifacts/."""

    @extend_schema(
        request={"multipart/form-data": ArtifactUploadSerializer}, responses={201: ArtifactSerializer}
    )
    @action(detail=True, methods=["get", "post"], parser_classes=[MultiPartParser])
    def artifacts(self, request: Request, external_id: str) -> Response:
        """Upload a profiling artifact (multipart `file`, optional `kind`, `rank` and `timezone`), or list
        the job's."""
        if request.method == "POST":
            # Login/token and team from the headers before the body is parsed (the middleware did the
            # same for the URL; this holds when the view is reached another way), then the size limit.
            try:
                authorise_upload(request._request, external_id, api=True)
            except UploadRefusal as refusal:
                return Response({"detail": refusal.message}, status=refusal.status)
            install_upload_limit(request._request)
        job = self._get(request, external_id)  # type: ignore[attr-defined]
        if request.method == "GET":
            return Response(ArtifactSerializer(job.artifacts.all(), many=True).data)
        data = request.data
        if refused := upload_refused(request):
            return Response({"file": refused}, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
        body = ArtifactUploadSerializer(data=data)
        body.is_valid(raise_exception=True)
        try:
            artifact = store_upload(
                job,
                body.validated_data["file"],
                kind=body.validated_data.get("kind"),
                rank=body.validated_data.get("rank"),
                user=request.user,
                time_zone=body.validated_data.get("timezone") or None,
            )
        except UploadError as exc:
            raise ValidationError({"file": str(exc)}) from None
        return Response(ArtifactSerializer(artifact).data, status=status.HTTP_201_CREATED)


def _summary(request: Request, job: Job) -> dict[str, Any]:
    """The job summary as the caller may read it: only readable runs of its baseline are named (baselines
    are team-scoped, so these are the job's team's runs; the filter is the read policy's backstop)."""
    body = job_summary(job)
    baseline = body.get("baseline")
    if baseline and baseline.get("runs") and readable_team_ids(request.user) is not None:
        visible = readable_jobs(request.user, Job.objects.filter(external_id__in=baseline["runs"]))
        baseline["runs"] = sorted(visible.values_list("external_id", flat=True))
    return body


def _ownership_refusal(exc: OwnershipError) -> APIException:
    """The HTTP answer to a refused claim: 400, 403 or 409 with the message under the field it is about."""
    detail = {exc.field: [exc.message]}
    if exc.status == status.HTTP_409_CONFLICT:
        return Conflict(detail)
    if exc.status == status.HTTP_403_FORBIDDEN:
        return PermissionDenied(exc.message)
    return ValidationError(detail)


def _refuse_free_form(data: dict[str, Any]) -> None:
    if data.get("throughput_query_free_form"):
        raise PermissionDenied(
            "only staff may set free-form PromQL (throughput_query_free_form); write throughput_query as a "
            "template such as sum(rate(train_tokens_total{$job}[5m]))"
        )


class JobViewSet(JobArtifactsMixin, viewsets.ViewSet):
    """Jobs, addressed by their external id (the scheduler's id)."""

    permission_classes = [IsAuthenticated, TeamScopedWrite]
    lookup_field = "external_id"
    lookup_value_regex = r"[^/]+"

    def _get(self, request: Request, external_id: str) -> Job:
        claimant = Claimant.of(request.user, request.auth)
        if claimant.is_scheduler:
            # A scheduler credential reads, updates and ends its own cluster's scheduler jobs, whatever the
            # team; any other job is "not found" to it.
            job = (
                summary_queryset()
                .filter(pk__in=scheduler_jobs(claimant).values("pk"))
                .filter(external_id=external_id)
                .first()
            )
            if job is None:
                raise NotFound("No job matches the given query.")
            return job
        # Another team's job is "not found" under READ_SCOPE=team (jobs.access.permissions), on reads and
        # writes.
        job = readable_job_or_404(request.user, summary_queryset(), external_id=external_id)
        self.check_object_permissions(request, job)
        return job

    @extend_schema(
        responses={200: _SUMMARY},
        parameters=[OpenApiParameter(key, str, description=text) for key, text in JOB_FILTER_HELP.items()],
    )
    def list(self, request: Request) -> Response:
        """Jobs, newest first, with the job list page's filters and sort (jobs.views.filters), e.g.
        ?team=llm&status=running&q=lora&since=2026-11-01&sort=-waste; a value that cannot be read is 400."""
        found = job_filterset(
            request, readable_jobs(request.user, Job.objects.select_related("team", "gpu_model")),
            request.query_params,
        )  # fmt: skip
        if problems := found.problems():
            raise ValidationError({"detail": problems})
        qs: QuerySet[Job] = found.qs
        paginator = BoundedLimitOffsetPagination()
        rows = paginator.paginate_queryset(qs, request, view=self) or []
        return paginator.get_paginated_response(
            [
                {
                    "external_id": j.external_id,
                    "name": j.name,
                    "team": j.team.slug,
                    "status": j.status,
                    "model_name": j.model_name,
                    "gpu_model": j.gpu_model.name if j.gpu_model else None,
                    "gpu_count": j.gpu_count,
                    "started_at": j.started_at,
                    "ended_at": j.ended_at,
                    "mfu": j.mfu,
                    "mfu_fallback": j.mfu_fallback,
                    "waste_per_day_usd": j.waste_per_day_usd,
                    "waste_lower_bound_per_day_usd": j.waste_lower_bound_per_day_usd,
                    "waste_unknown_reason": j.waste_unknown_reason or None,
                }
                for j in rows
            ]
        )

    @extend_schema(request=JobRegisterSerializer, responses={200: _SUMMARY, 201: _SUMMARY})
    def create(self, request: Request) -> Response:
        """Register a job. Idempotent on external_id: re-posting updates it and answers 200."""
        body = JobRegisterSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if not is_staff(request.user):
            _refuse_free_form(body.validated_data)
        # Who may claim this id, these GPUs, this selector, this owner: jobs.access.ownership, asked by the
        # registry.
        try:
            outcome = register_job(body.validated_data, Claimant.of(request.user, request.auth))
        except OwnershipError as exc:
            raise _ownership_refusal(exc) from None
        except RegistryConflict as exc:
            raise Conflict({"started_at": str(exc)}) from None
        except RegistryError as exc:
            raise PermissionDenied(str(exc)) from None
        job = summary_queryset().get(pk=outcome.job.pk)
        return Response(
            _summary(request, job), status=status.HTTP_201_CREATED if outcome.created else status.HTTP_200_OK
        )

    @extend_schema(responses={200: _SUMMARY})
    def retrieve(self, request: Request, external_id: str) -> Response:
        """The job summary: config, metrics (MFU, cost, waste), findings, artifacts, ingestion state."""
        return Response(_summary(request, self._get(request, external_id)))

    @extend_schema(request=JobEndSerializer, responses={200: _SUMMARY})
    def partial_update(self, request: Request, external_id: str) -> Response:
        """End a job (`ended_at`) or correct its name, kind, tokens per step, throughput query, price tier."""
        job = self._get(request, external_id)
        body = JobEndSerializer(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        if not is_staff(request.user):
            _refuse_free_form(body.validated_data)
        try:
            update_job(job, body.validated_data)
        except RegistryError as exc:
            raise ValidationError({"ended_at": str(exc)}) from None
        return Response(_summary(request, summary_queryset().get(pk=job.pk)))

    @extend_schema(
        request=ProgressSerializer(many=True),
        responses={202: OpenApiResponse(description="stored")},
    )
    @action(detail=True, methods=["post"])
    def progress(self, request: Request, external_id: str) -> Response:
        """Push progress: one {timestamp, step, tokens} object or a list of them (cumulative counts)."""
        job = self._get(request, external_id)
        payload: Any = request.data if isinstance(request.data, list) else [request.data]
        if len(payload) > 10_000:
            raise ValidationError("at most 10000 progress points per request")
        body = ProgressSerializer(data=payload, many=True)
        body.is_valid(raise_exception=True)
        try:
            stored = record_progress(job, body.validated_data)
        except RegistryConflict as exc:
            raise Conflict({"timestamp": str(exc)}) from None
        return Response({"stored": stored}, status=status.HTTP_202_ACCEPTED)


class ArtifactViewSet(viewsets.ReadOnlyModelViewSet):
    """Artifacts by id: status, failure reason and analysis; `reparse` queues parsing again."""

    serializer_class = ArtifactSerializer
    permission_classes = [IsAuthenticated, TeamScopedWrite]
    queryset = Artifact.objects.select_related("job", "job__team").order_by("-uploaded_at")

    def get_queryset(self) -> Any:
        return scope_to_teams(super().get_queryset(), self.request.user, "job__team_id")

    @extend_schema(request=None, responses={202: ArtifactSerializer})
    @action(detail=True, methods=["post"])
    def reparse(self, request: Request, pk: str) -> Response:
        """Parse the stored file again (after a parser fix, or to retry)."""
        artifact = requeue(self.get_object())  # TeamScopedWrite refuses other teams on POST
        return Response(ArtifactSerializer(artifact).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=ArtifactReviewSerializer, responses={200: ArtifactSerializer})
    @action(detail=True, methods=["post"])
    def review(self, request: Request, pk: str) -> Response:
        """`confirm` that a mismatched artifact belongs to its job, `exclude` it from the diagnosis, or
        `include` it again; the job is re-evaluated."""
        body = ArtifactReviewSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            artifact = review_artifact(self.get_object(), body.validated_data["action"], request.user)
        except ReviewError as exc:
            raise ValidationError({"action": str(exc)}) from None
        return Response(ArtifactSerializer(artifact).data)


class PromoteSerializer(serializers.Serializer):
    """Body of POST /api/v1/baselines/: the finished job to add to its team's baseline of its config."""

    job = serializers.CharField(help_text="external id of a finished job")
    override_reason = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=OVERRIDE_REASON_MAX,
        help_text="why a run with warning-or-worse gpu_errors/throttling/straggler findings is a healthy "
        "reference anyway (recorded with who and which findings); without it such a run is refused (409)",
    )


class BaselineViewSet(viewsets.ReadOnlyModelViewSet):
    """Healthy baselines per model + config fingerprint: list, promote a job into one, retire one."""

    serializer_class = BaselineSerializer
    permission_classes = [IsAuthenticated, TeamScopedWrite]

    @extend_schema(
        request=PromoteSerializer,
        responses={
            201: BaselineSerializer,
            400: OpenApiResponse(description="not finished, no fingerprint or no numbers yet"),
            403: OpenApiResponse(description="not a member of the job's team"),
            409: OpenApiResponse(description="health findings and no override_reason"),
        },
    )
    def create(self, request: Request) -> Response:
        """Promote a finished job: it joins (or starts) its own team's active baseline of its config
        fingerprint. Every rule is jobs.evaluation.baselines.promote's (the job page calls it too)."""
        body = PromoteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        job = readable_job_or_404(
            request.user,
            Job.objects.select_related("team", "gpu_model"),
            external_id=body.validated_data["job"],
        )
        try:
            promotion = promote(
                job, request.user, override_reason=body.validated_data.get("override_reason", "")
            )
        except PromotionForbidden as exc:
            raise PermissionDenied(str(exc)) from None
        except UnhealthyRun as exc:
            return Response({"job": [str(exc)], "findings": exc.codes}, status=status.HTTP_409_CONFLICT)
        except BaselineError as exc:
            raise ValidationError({"job": str(exc)}) from None
        return Response(BaselineSerializer(promotion.baseline).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: BaselineSerializer})
    @action(detail=True, methods=["post"])
    def retire(self, request: Request, pk: str) -> Response:
        """Retire a baseline: kept for history, jobs stop being compared with it."""
        baseline = retire(self.get_object())
        return Response(BaselineSerializer(baseline).data)

    def get_queryset(self) -> Any:
        qs = scope_to_teams(
            Baseline.objects.select_related("team").prefetch_related("runs"), self.request.user
        )
        # The baselines page's filters (jobs.views.filters): include_retired=1, fingerprint.
        return BaselineFilterSet(self.request.query_params, queryset=qs, request=self.request).qs
