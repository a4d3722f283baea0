"""Where alerts go besides the browser: a project's webhooks, and one row per alert change sent to one."""
from __future__ import annotations

from django.db import models
from django.utils import timezone

from dashboard.detection.models import Alert
from dashboard.tenancy.models import Project


class Webhook(models.Model):
    """A Slack-compatible endpoint that receives a project's alert notifications."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="webhooks")
    url = models.URLField(max_length=1000)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "dashboard_webhook"


class Notification(models.Model):
    """One alert change delivered to one webhook: the unique key makes retries send it once. A
    pending one is (re)sent by the sweep from `next_attempt_at` on (notifications.py); it becomes
    failed, visible on the alert, only after MAX_ATTEMPTS spread over more than a day."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="notifications")
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE)
    revision = models.PositiveIntegerField()
    state = models.CharField(max_length=16, default="pending")  # pending | sent | failed
    attempts = models.PositiveIntegerField(default=0)
    sent_at = models.DateTimeField(null=True)
    last_error = models.TextField(blank=True)
    next_attempt_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "dashboard_notification"
        constraints = [models.UniqueConstraint(fields=["alert", "webhook", "revision"], name="notify_once")]
        indexes = [models.Index(fields=["next_attempt_at"], name="notification_due",
                                condition=models.Q(state="pending"))]
