"""Django admin for operators: projects with members and tokens, runs, alerts, silences, webhooks.

Registered from dashboard/urls.py (the ingest and dashboard apps have no admin module of their own).
"""
from __future__ import annotations

from django.contrib import admin

from dashboard.models import Alert, Baseline, Silence, Webhook
from ingest.models import Project, ProjectToken, Rank, Run


class TokenInline(admin.TabularInline):
    model = ProjectToken
    fields = ("prefix", "created_at")
    readonly_fields = ("prefix", "created_at")
    extra = 0
    can_delete = True

    def has_add_permission(self, request, obj=None) -> bool:
        return False  # tokens are issued with `manage.py createtoken`, which prints the secret once


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("name", "created_at")
    search_fields = ("name",)
    filter_horizontal = ("members",)
    inlines = [TokenInline]


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("key", "name", "project", "world_size", "torch_version", "started_at", "last_step")
    list_filter = ("project",)
    search_fields = ("key", "name")
    readonly_fields = ("started_at", "last_seen")


@admin.register(Rank)
class RankAdmin(admin.ModelAdmin):
    list_display = ("run", "rank", "host", "status", "last_step", "last_seen")
    list_select_related = ("run",)
    search_fields = ("run__key", "host")


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


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    list_display = ("project", "url", "active", "created_at")


@admin.register(Baseline)
class BaselineAdmin(admin.ModelAdmin):
    list_display = ("run", "baseline", "chosen_by", "created_at")
