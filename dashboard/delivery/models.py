"""Where incidents go besides the browser: a project's destinations (Slack-compatible webhooks,
Alertmanager, PagerDuty, JSON webhooks), one row per incident revision sent to one, and the
Alertmanager silences that mirror Lockstep's acks and silences."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from dashboard.delivery import outbound, sinks
from dashboard.detection.models import Incident
from dashboard.tenancy.models import Project


class Webhook(models.Model):
    """One destination of a project's alert notifications; `kind` picks its sink (sinks/).

    `secret` is what the kind needs and nobody should read back: PagerDuty's routing key (required),
    the JSON webhook's signing key (optional). The admin never shows it."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="webhooks")
    kind = models.CharField(max_length=16, choices=sinks.choices, default="slack")
    url = models.URLField(
        max_length=1000,
        blank=True,
        help_text=(
            "Slack / JSON: the webhook URL. Alertmanager: its base URL (alerts go to /api/v2/alerts). "
            "PagerDuty: blank for https://events.pagerduty.com/v2/enqueue."
        ),
    )
    secret = models.CharField(
        max_length=500,
        blank=True,
        help_text=(
            "PagerDuty: the integration's routing key. JSON: an optional key to sign bodies with "
            "(X-Lockstep-Signature: sha256=HMAC). Not used by the other kinds."
        ),
    )
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "alert destination"

    def __str__(self) -> str:
        return f"{self.get_kind_display()} of {self.project}"

    def clean(self) -> None:
        """What the kind needs (its sink's schema), refused with the field's name before anything is stored."""
        sink = sinks.SINKS.get(self.kind)
        if sink is not None and (problem := sink.problem(self.url, self.secret)):
            raise ValidationError(problem)
        if self.url:
            try:
                outbound.check_url(self.url)
            except outbound.Refused as exc:
                raise ValidationError({"url": str(exc)}) from None
            except outbound.SendError:
                pass  # a name that does not resolve here yet: checked again, resolved, at every send


class Notification(models.Model):
    """One incident revision delivered to one destination: the unique key makes retries send it once.
    A pending one is (re)sent by the sweep from `next_attempt_at` on (notifications.py); it becomes
    failed, visible on the alerts, only after MAX_ATTEMPTS spread over more than a day, and
    `superseded` when a later revision replaced it before it went out (the latest state wins).
    `receipt`: what the transport reported sending, which the next revision's send may need (the
    label set Alertmanager was given, to end it when the labels change). `refresh_at`: when the
    latest revision Alertmanager holds of a firing incident is sent again (its `endsAt` is short)."""

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="notifications")
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE)
    revision = models.PositiveIntegerField()
    state = models.CharField(max_length=16, default="pending")  # pending | sent | failed | superseded
    attempts = models.PositiveIntegerField(default=0)
    sent_at = models.DateTimeField(null=True)
    last_error = models.TextField(blank=True)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    receipt = models.JSONField(default=dict)
    refresh_at = models.DateTimeField(null=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["incident", "webhook", "revision"], name="notify_once")]
        indexes = [
            models.Index(fields=["next_attempt_at"], name="notification_due", condition=models.Q(state="pending")),
            models.Index(
                fields=["refresh_at"], name="notification_refresh", condition=models.Q(refresh_at__isnull=False)
            ),
        ]


class SinkSilence(models.Model):
    """The Alertmanager silence (matchers `project` and `incident`) that mirrors an incident's ack or a
    Lockstep silence of its root, one per (incident, Alertmanager destination). `until` is what
    Lockstep wants (null: no silence), `silence_id` what Alertmanager holds; a pending row is
    synced by the sweep with the notifications' backoff (mirror.py)."""

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="+")
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE)
    until = models.DateTimeField(null=True)
    comment = models.TextField(blank=True)
    silence_id = models.CharField(max_length=64, blank=True)
    state = models.CharField(max_length=16, default="pending")  # pending | synced | failed
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    next_attempt_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "delivery_sinksilence"
        constraints = [models.UniqueConstraint(fields=["incident", "webhook"], name="sink_silence_once")]
        indexes = [
            models.Index(fields=["next_attempt_at"], name="sink_silence_due", condition=models.Q(state="pending"))
        ]
