"""A project's webhooks in the Django admin."""
from __future__ import annotations

from django.contrib import admin

from dashboard.delivery.models import Webhook


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    list_display = ("project", "url", "active", "created_at")
