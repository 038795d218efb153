"""Admin: teams and members, the GPU catalog and price book (editable), jobs, tokens, deliveries."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest

from jobs.models import (
    AlertDelivery,
    AlertIncident,
    AlertSubscription,
    ApiToken,
    Artifact,
    Baseline,
    Finding,
    GpuModel,
    IdlePolicy,
    Job,
    Membership,
    PolicyAction,
    PriceEntry,
    PromotionOverride,
    ReportDelivery,
    SsoIdentity,
    Team,
)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "monthly_budget_usd", "created_at"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]


class PriceInline(admin.TabularInline):
    model = PriceEntry
    extra = 1


@admin.register(GpuModel)
class GpuModelAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "vendor",
        "memory_mib",
        "bandwidth_tbps",
        "sm_count",
        "tdp_w",
        "peak_clock_mhz",
        "max_clock_mhz",
        "single_source",
    ]
    list_filter = ["vendor", "single_source"]
    search_fields = ["name", "aliases"]
    inlines = [PriceInline]


@admin.register(PriceEntry)
class PriceEntryAdmin(admin.ModelAdmin):
    list_display = ["gpu_model", "tier", "usd_per_gpu_hour", "effective_from", "source"]
    list_filter = ["tier", "gpu_model"]


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = [
        "external_id",
        "name",
        "team",
        "model_name",
        "gpu_model",
        "gpu_count",
        "status",
        "started_at",
        "mfu",
    ]
    list_filter = ["status", "team", "gpu_model"]
    search_fields = ["external_id", "name", "model_name", "owner"]
    date_hierarchy = "started_at"
    readonly_fields = ["created_at", "updated_at", "config_fingerprint"]


@admin.register(Artifact)
class ArtifactAdmin(admin.ModelAdmin):
    list_display = ["original_name", "job", "kind", "rank", "status", "size_bytes", "uploaded_at"]
    list_filter = ["status", "kind"]
    search_fields = ["original_name", "sha256", "job__external_id"]
    readonly_fields = ["sha256", "size_bytes", "analysis"]


@admin.register(Finding)
class FindingAdmin(admin.ModelAdmin):
    list_display = ["code", "job", "severity", "confidence", "waste_per_day_usd", "updated_at"]
    list_filter = ["code", "severity"]
    search_fields = ["job__external_id"]


@admin.register(Baseline)
class BaselineAdmin(admin.ModelAdmin):
    """Baselines for inspection and retiring (set retired at). Runs join a baseline only through
    jobs.evaluation.baselines.promote (its team and health rules), so runs, team and statistics are read-only
    here and baselines are not added here."""

    list_display = ["model_name", "fingerprint", "team", "created_at", "retired_at"]
    list_filter = ["team"]
    readonly_fields = ["fingerprint", "model_name", "team", "config", "runs", "stats", "created_by"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Baselines are created by promoting a run (job page or API), never by hand."""
        return False


@admin.register(PromotionOverride)
class PromotionOverrideAdmin(admin.ModelAdmin):
    """Runs promoted despite hardware/health findings, with the reason given (read-only audit trail)."""

    list_display = ["job", "baseline", "user", "reason", "created_at"]
    readonly_fields = ["baseline", "job", "user", "finding_codes", "reason", "created_at"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are created here; the key is shown once in a message and only its hash is stored."""

    list_display = ["name", "user", "kind", "cluster", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["kind"]
    fields = ["user", "name", "kind", "cluster", "prefix", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["prefix", "created_at", "last_used_at"]
    autocomplete_fields = ["user"]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> Any:
        # What a token may do is fixed when it is issued: a user token never becomes a scheduler's.
        return [*self.readonly_fields, "kind", "cluster"] if obj is not None else self.readonly_fields

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        token, key = ApiToken.issue(obj.user, obj.name, kind=obj.kind, cluster=obj.cluster)
        obj.pk, obj.prefix, obj.key_hash = token.pk, token.prefix, token.key_hash
        messages.warning(request, f"Token for {obj.user}: {key} — copy it now, it will not be shown again.")


@admin.register(ReportDelivery)
class ReportDeliveryAdmin(admin.ModelAdmin):
    list_display = ["team", "week_start", "status", "attempts", "sent_at"]
    list_filter = ["status", "team"]


@admin.register(AlertIncident)
class AlertIncidentAdmin(admin.ModelAdmin):
    list_display = ["rule", "job", "team", "started_at", "opened_at", "resolved_at"]
    list_filter = ["rule", "team"]
    search_fields = ["job__external_id", "title"]
    raw_id_fields = ["job", "finding"]


@admin.register(AlertSubscription)
class AlertSubscriptionAdmin(admin.ModelAdmin):
    """Webhook URLs and secrets are stored encrypted and never shown: edit them on the team's alerts page."""

    list_display = ["channel", "team", "user", "email", "url_hint", "enabled"]
    list_filter = ["channel", "enabled"]
    exclude = ["url_encrypted", "secret_encrypted"]


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(admin.ModelAdmin):
    list_display = ["incident", "event", "channel", "status", "attempts", "sent_at"]
    list_filter = ["status", "channel", "event"]
    readonly_fields = ["claim_token"]


@admin.register(IdlePolicy)
class IdlePolicyAdmin(admin.ModelAdmin):
    list_display = ["team", "enabled", "dry_run", "warn_after_minutes", "grace_minutes"]


@admin.register(PolicyAction)
class PolicyActionAdmin(admin.ModelAdmin):
    list_display = ["at", "team", "job", "kind", "outcome", "actor", "target"]
    list_filter = ["kind", "outcome", "team"]
    raw_id_fields = ["job", "incident"]


@admin.register(SsoIdentity)
class SsoIdentityAdmin(admin.ModelAdmin):
    """Provider identities (issuer + subject) and the account each signs in as. Adding one here is how an
    admin links a staff or superuser account to SSO: a login never matches those by email
    (jobs.sso.backend)."""

    list_display = ["user", "subject", "issuer", "linked_by", "email_at_link", "created_at", "last_login_at"]
    search_fields = ["subject", "user__username", "email_at_link"]
    list_filter = ["issuer", "linked_by"]
    autocomplete_fields = ["user"]
    readonly_fields = ["linked_by", "email_at_link", "created_at", "last_login_at"]

    def save_model(self, request: HttpRequest, obj: SsoIdentity, form: Any, change: bool) -> None:
        """An identity created here is an admin's explicit link."""
        if not change:
            obj.linked_by = "admin"
        super().save_model(request, obj, form, change)
