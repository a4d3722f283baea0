"""Where alerts go besides the browser: a project's destinations (Slack-compatible webhooks,
Alertmanager, PagerDuty, JSON webhooks), and one row per alert change sent to one."""
from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from dashboard.detection.models import Alert
from dashboard.tenancy.models import Project


class Webhook(models.Model):
    """One destination of a project's alert notifications; `kind` picks its transport (transports.py).

    `secret` is what the kind needs and nobody should read back: PagerDuty's routing key (required),
    the JSON webhook's signing key (optional). The admin never shows it."""

    class Kind(models.TextChoices):
        SLACK = "slack", "Slack-compatible webhook"
        ALERTMANAGER = "alertmanager", "Alertmanager (v2 API)"
        PAGERDUTY = "pagerduty", "PagerDuty Events v2"
        JSON = "json", "JSON webhook"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="webhooks")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.SLACK)
    url = models.URLField(max_length=1000, blank=True, help_text=(
        "Slack / JSON: the webhook URL. Alertmanager: its base URL (alerts go to /api/v2/alerts). "
        "PagerDuty: blank for https://events.pagerduty.com/v2/enqueue."))
    secret = models.CharField(max_length=500, blank=True, help_text=(
        "PagerDuty: the integration's routing key. JSON: an optional key to sign bodies with "
        "(X-Lockstep-Signature: sha256=HMAC). Not used by the other kinds."))
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "dashboard_webhook"
        verbose_name = "alert destination"

    def __str__(self) -> str:
        return f"{self.get_kind_display()} of {self.project}"

    def clean(self) -> None:
        """What each kind needs, refused with the field's name before anything is stored."""
        needs_url = self.kind != self.Kind.PAGERDUTY
        if needs_url and not self.url:
            raise ValidationError({"url": f"a {self.get_kind_display()} needs a URL"})
        if self.kind == self.Kind.PAGERDUTY and not self.secret:
            raise ValidationError({"secret": "PagerDuty needs the integration's routing key"})
        if self.secret and self.kind in (self.Kind.SLACK, self.Kind.ALERTMANAGER):
            raise ValidationError({"secret": f"a {self.get_kind_display()} takes no secret"})


class Notification(models.Model):
    """One alert change delivered to one destination: the unique key makes retries send it once. A
    pending one is (re)sent by the sweep from `next_attempt_at` on (notifications.py); it becomes
    failed, visible on the alert, only after MAX_ATTEMPTS spread over more than a day. `receipt`:
    what the transport reported sending, which the next revision's send may need (the label set
    Alertmanager was given, to end it when the labels change)."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="notifications")
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE)
    revision = models.PositiveIntegerField()
    state = models.CharField(max_length=16, default="pending")  # pending | sent | failed
    attempts = models.PositiveIntegerField(default=0)
    sent_at = models.DateTimeField(null=True)
    last_error = models.TextField(blank=True)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    receipt = models.JSONField(default=dict)

    class Meta:
        db_table = "dashboard_notification"
        constraints = [models.UniqueConstraint(fields=["alert", "webhook", "revision"], name="notify_once")]
        indexes = [models.Index(fields=["next_attempt_at"], name="notification_due",
                                condition=models.Q(state="pending"))]
