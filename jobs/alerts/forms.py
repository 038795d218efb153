"""Forms of the alert pages. Webhook URLs and secrets are write-only: the inputs never carry the stored value
(render_value=False), and an empty input keeps what is stored."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings

from jobs.alerts import outbound, rules, secrets
from jobs.models import AlertIncident, AlertSubscription, IdlePolicy


class SubscriptionForm(forms.Form):
    channel = forms.ChoiceField(choices=AlertSubscription.Channel.choices)
    email = forms.EmailField(required=False, help_text="Email channel: the address (empty: your own).")
    url = forms.CharField(
        required=False,
        max_length=outbound.MAX_URL_LENGTH,
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
            # The rules of jobs.alerts.outbound, so what is stored is what can be sent: http(s), a valid
            # host and port, and (known without DNS) no IP literal that the sender would refuse.
            try:
                target = outbound.parse_url(data.get("url") or "")
            except outbound.BadUrl as exc:
                self.add_error("url", f"Not a usable webhook URL: {exc}.")
                return data
            problem = outbound.literal_problem(target, outbound.AllowList.parse(settings.ALERT_ALLOWED_HOSTS))
            if problem is not None:
                self.add_error(
                    "url",
                    f"Webhook URLs may not point at internal addresses ({problem}); an operator can allow "
                    "a host with ALERT_ALLOWED_HOSTS.",
                )
                return data
            data["target"] = target
        return data

    def save(self, *, team: Any = None, user: Any = None, created_by: Any = None) -> AlertSubscription:
        data = self.cleaned_data
        sub = AlertSubscription(team=team, user=user, channel=data["channel"], created_by=created_by)
        sub.rules = [r for r in data.get("rules") or [] if r in rules.RULES]
        if sub.channel == AlertSubscription.Channel.EMAIL:
            sub.email = data.get("email") or ""
        else:
            url = data["url"].strip()
            sub.url_encrypted = secrets.seal(url)
            sub.url_hint = data["target"].hint
            sub.secret_encrypted = secrets.seal(data.get("secret") or "")
        sub.save()
        return sub


class IdlePolicyForm(forms.ModelForm):
    class Meta:
        model = IdlePolicy
        fields = ["enabled", "dry_run", "warn_after_minutes", "grace_minutes", "action"]
