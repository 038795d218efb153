"""GET /api/v1/alerts/: incidents (rule, job, since, finding, deliveries), filtered by team and state."""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import generics, serializers
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import IsAuthenticated

from jobs.access.permissions import scope_to_teams
from jobs.models import AlertDelivery, AlertIncident, Team

STATES = ("open", "resolved", "all")


class AlertFindingSerializer(serializers.Serializer[Any]):
    code = serializers.CharField()
    title = serializers.CharField()
    waste_per_day_usd = serializers.FloatField(allow_null=True, help_text="null = impact unknown, never 0")


class AlertDeliverySerializer(serializers.ModelSerializer[AlertDelivery]):
    class Meta:
        model = AlertDelivery
        fields = ["event", "channel", "destination", "status", "attempts", "created_at", "sent_at", "error"]
        read_only_fields = fields


class AlertIncidentSerializer(serializers.ModelSerializer[AlertIncident]):
    job = serializers.CharField(source="job.external_id", help_text="The job's external (scheduler) id")
    team = serializers.CharField(source="team.slug")
    state = serializers.SerializerMethodField()
    since = serializers.DateTimeField(source="started_at", help_text="When the condition began")
    finding = serializers.SerializerMethodField()
    deliveries = AlertDeliverySerializer(many=True, read_only=True)

    class Meta:
        model = AlertIncident
        fields = [
            "id", "rule", "job", "team", "state", "title", "since", "opened_at", "last_seen_at",
            "resolved_at", "resolve_reason", "finding", "evidence", "deliveries",
        ]  # fmt: skip
        read_only_fields = fields

    def get_state(self, obj: AlertIncident) -> str:
        return "open" if obj.resolved_at is None else "resolved"

    @extend_schema_field(AlertFindingSerializer(allow_null=True))
    def get_finding(self, obj: AlertIncident) -> dict[str, Any] | None:
        if obj.finding is not None:
            return AlertFindingSerializer(obj.finding).data
        if obj.finding_code:
            return {"code": obj.finding_code, "title": "", "waste_per_day_usd": None}
        return None


@extend_schema(
    parameters=[
        OpenApiParameter("team", str, description="Team slug"),
        OpenApiParameter("state", str, enum=list(STATES), description="open (default), resolved or all"),
        OpenApiParameter("job", str, description="A job's external id"),
    ]
)
class AlertListView(generics.ListAPIView[AlertIncident]):
    """Alert incidents, newest first, of the teams the caller may read (READ_SCOPE,
    jobs.access.permissions)."""

    serializer_class = AlertIncidentSerializer
    permission_classes = [IsAuthenticated]

    def get_queryset(self) -> QuerySet[AlertIncident]:
        params = self.request.query_params
        state = params.get("state", "open")
        if state not in STATES:
            raise ValidationError({"state": f"must be one of {', '.join(STATES)}"})
        qs = scope_to_teams(
            AlertIncident.objects.select_related("job", "team", "finding").prefetch_related(
                Prefetch("deliveries", queryset=AlertDelivery.objects.order_by("created_at"))
            ),
            self.request.user,
        )
        if (slug := params.get("team")) is not None:
            if not Team.objects.filter(slug=slug).exists():
                raise ValidationError({"team": f"no team {slug!r}"})
            qs = qs.filter(team__slug=slug)
        if (job := params.get("job")) is not None:
            qs = qs.filter(job__external_id=job)
        if state == "open":
            qs = qs.filter(resolved_at__isnull=True)
        elif state == "resolved":
            qs = qs.filter(resolved_at__isnull=False)
        return qs.order_by("-started_at", "-pk")
