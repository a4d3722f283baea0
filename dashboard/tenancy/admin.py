"""Operators manage projects (members, tokens), runs and ranks in the Django admin."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from dashboard.tenancy.models import Project, ProjectToken, Rank, Run


class TokenInline(admin.TabularInline):
    model = ProjectToken
    fields = ("prefix", "scopes", "created_at")
    readonly_fields = ("prefix", "scopes", "created_at")
    extra = 0
    can_delete = True

    def has_add_permission(self, request: HttpRequest, obj: Project | None = None) -> bool:
        return False  # tokens are issued with `manage.py createtoken`, which prints the secret once


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("name", "gpu_hour_price", "compile_budget", "created_at")
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
