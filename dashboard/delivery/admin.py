"""A project's alert destinations in the Django admin: kind, URL, and a secret that is never shown back."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django import forms
from django.contrib import admin

from dashboard.delivery import sinks
from dashboard.delivery.models import Webhook


class WebhookForm(forms.ModelForm):
    """The secret is write-only: the field starts empty, and left empty it keeps the stored one."""

    secret = forms.CharField(
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False),
        help_text=Webhook._meta.get_field("secret").help_text
        + " Leave empty to keep the stored one; tick 'clear secret' to remove it.",
    )
    clear_secret = forms.BooleanField(required=False, label="clear secret")

    class Meta:
        model = Webhook
        fields = ("project", "kind", "url", "secret", "clear_secret", "active")

    def clean(self) -> dict[str, Any]:
        """Decide the secret before the model's own checks see it (they need the kept one)."""
        data = super().clean()
        assert data is not None  # ModelForm.clean returns cleaned_data
        if data.get("clear_secret"):
            data["secret"] = ""
        elif not data.get("secret") and self.instance.pk:
            data["secret"] = self.instance.secret
        return data


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    form = WebhookForm
    list_display = ("project", "kind", "destination", "has_secret", "active", "created_at")
    list_filter = ("kind", "active")

    @admin.display(description="destination")
    def destination(self, hook: Webhook) -> str:
        """Scheme and host only: a Slack or JSON webhook URL often carries its own token in the path."""
        if not hook.url:
            sink = sinks.SINKS.get(hook.kind)
            return f"{sink.label} (default URL)" if sink is not None and sink.default_url else "-"
        parts = urlsplit(hook.url)
        return f"{parts.scheme}://{parts.netloc}/…" if parts.path.strip("/") else f"{parts.scheme}://{parts.netloc}"

    @admin.display(boolean=True, description="secret set")
    def has_secret(self, hook: Webhook) -> bool:
        return bool(hook.secret)
