"""Forms of the alert pages. Webhook URLs and secrets are write-only: the inputs never carry the stored value
(render_value=False), and an empty input keeps what is stored."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django import forms

from jobs.alerts import rules, secrets
from jobs.models import AlertIncident, AlertSubscription, IdlePolicy


class SubscriptionForm(forms.Form):
    channel = forms.ChoiceField(choices=AlertSubscription.Channel.choices)
    email = forms.EmailField(required=False, help_text="Email channel: the address (empty: your own).")
    url = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.PasswordInput(render_value=False),
        label="Webhook URL",
        help_text="Stored encrypted; shown afterwards as its host only.",
    )
    secret = forms.CharField(
        required=False,
        max_length=500,
        widget=forms.PasswordInput(render_value=False),
        help_text="JSON webhook: HMAC-SHA256 signing key; Alertmanager: bearer token. Never shown again.",
    )
    rules = forms.MultipleChoiceField(
        choices=AlertIncident.Rule.choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: every rule.",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        channel = data.get("channel")
        if channel and channel != AlertSubscription.Channel.EMAIL:
            url = (data.get("url") or "").strip()
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                self.add_error("url", "An http(s) URL is required for a webhook.")
        return data

    def save(self, *, team: Any = None, user: Any = None, created_by: Any = None) -> AlertSubscription:
        data = self.cleaned_data
        sub = AlertSubscription(team=team, user=user, channel=data["channel"], created_by=created_by)
        sub.rules = [r for r in data.get("rules") or [] if r in rules.RULES]
        if sub.channel == AlertSubscription.Channel.EMAIL:
            sub.email = data.get("email") or ""
        else:
            url = data["url"].strip()
            parts = urlsplit(url)
            sub.url_encrypted = secrets.seal(url)
            sub.url_hint = f"{parts.scheme}://{parts.hostname}{':' + str(parts.port) if parts.port else ''}/…"
            sub.secret_encrypted = secrets.seal(data.get("secret") or "")
        sub.save()
        return sub


class IdlePolicyForm(forms.ModelForm):
    class Meta:
        model = IdlePolicy
        fields = ["enabled", "dry_run", "warn_after_minutes", "grace_minutes", "action"]
