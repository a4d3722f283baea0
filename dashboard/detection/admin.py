"""Alerts, silences and baselines in the Django admin."""

from __future__ import annotations

from django.contrib import admin

from dashboard.detection.models import Alert, Baseline, Silence


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = ("run", "kind", "severity", "state", "step", "acked_by", "first_seen")
    list_filter = ("state", "severity", "kind")
    list_select_related = ("run", "acked_by")
    search_fields = ("run__key", "message")


@admin.register(Silence)
class SilenceAdmin(admin.ModelAdmin):
    list_display = ("project", "run", "kind", "rank", "expires_at", "author", "comment")
    list_select_related = ("project", "run", "author")


@admin.register(Baseline)
class BaselineAdmin(admin.ModelAdmin):
    list_display = ("run", "baseline", "chosen_by", "created_at")
