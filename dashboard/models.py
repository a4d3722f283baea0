"""Detection state: compile and gradient slots with their consensus, and the alerts raised on them."""
from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

from ingest.models import Run


class Slot(models.Model):
    """Something every rank must report once; settles when all did or the settle timeout passed.

    `reported` counts rank reports; the slot is pending while it was never settled or more
    reports arrived since (`reported > settled_n`), so late reports re-run the rules.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE)
    reported = models.PositiveIntegerField(default=0)
    first_seen = models.DateTimeField()
    settled_at = models.DateTimeField(null=True)
    settled_n = models.PositiveIntegerField(default=0)
    dissenters = ArrayField(models.PositiveIntegerField(), default=list)
    consensus = models.JSONField(default=dict)

    class Meta:
        abstract = True

    @property
    def pending(self) -> bool:
        return self.settled_at is None or self.reported > self.settled_n


class CompileSlot(Slot):
    """(run, normalized frame key, n-th compile of that frame)."""

    frame = models.CharField(max_length=512)
    index = models.PositiveIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "frame", "index"], name="compile_slot_once")]
        indexes = [models.Index(fields=["settled_at", "first_seen"], name="compile_slot_sweep")]


class GradSlot(Slot):
    """(run, step, comparison group); the buckets are compared inside one slot."""

    step = models.BigIntegerField()
    group = models.CharField(max_length=64)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "step", "group"], name="grad_slot_once")]
        indexes = [
            models.Index(fields=["settled_at", "first_seen"], name="grad_slot_sweep"),
            # a batch's late reports (`slots.grad_reports_ctes`): one descent finds no settled slot
            # among its steps, where probing each step by grad_slot_once cost ~2 us per rank-step
            models.Index(fields=["run", "group", "step"], name="grad_slot_settled", condition=Q(settled_at__isnull=False)),
        ]


class Alert(models.Model):
    """One desync: identity (run, kind, subject); ranks and steps it spans live in the body."""

    class State(models.TextChoices):
        FIRING = "firing"
        RESOLVED = "resolved"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="alerts")
    kind = models.CharField(max_length=64)
    subject = models.CharField(max_length=600)
    severity = models.CharField(max_length=16)
    state = models.CharField(max_length=16, choices=State.choices, default=State.FIRING)
    ranks = ArrayField(models.PositiveIntegerField(), default=list)
    step = models.BigIntegerField(null=True)
    frame = models.CharField(max_length=512, null=True)
    message = models.TextField()
    details = models.JSONField(default=dict)
    count = models.PositiveIntegerField(default=1)
    first_seen = models.DateTimeField(auto_now_add=True)
    last_seen = models.DateTimeField(auto_now=True)
    acked_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    acked_at = models.DateTimeField(null=True)
    resolved_at = models.DateTimeField(null=True)
    last_position = models.BigIntegerField(null=True)  # latest step / compile index that fired it
    revision = models.PositiveIntegerField(default=1)  # bumped on every change worth notifying
    notified_revision = models.PositiveIntegerField(default=0)  # last revision pushed to websockets

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "kind", "subject"], name="alert_identity")]
        ordering = ["-first_seen"]

    def as_json(self) -> dict:
        return {
            "id": self.id,
            "run": self.run.key,
            "kind": self.kind,
            "severity": self.severity,
            "state": self.state,
            "ranks": sorted(self.ranks),
            "step": self.step,
            "frame": self.frame,
            "message": self.message,
            "details": self.details,
            "count": self.count,
            "first_seen": self.first_seen.isoformat(),
            "last_seen": self.last_seen.isoformat(),
            "acked_by": self.acked_by.get_username() if self.acked_by else None,
            "acked_at": self.acked_at.isoformat() if self.acked_at else None,
        }


class Silence(models.Model):
    """Mutes notifications of matching alerts until it expires (Alertmanager-style matchers).

    An empty matcher matches everything; `rank` matches alerts whose rank list contains it.
    """

    project = models.ForeignKey("ingest.Project", on_delete=models.CASCADE, related_name="silences")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE)
    kind = models.CharField(max_length=64, blank=True)
    rank = models.PositiveIntegerField(null=True, blank=True)
    expires_at = models.DateTimeField()
    comment = models.TextField()
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]


class Webhook(models.Model):
    """A Slack-compatible endpoint that receives a project's alert notifications."""

    project = models.ForeignKey("ingest.Project", on_delete=models.CASCADE, related_name="webhooks")
    url = models.URLField(max_length=1000)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)


class Notification(models.Model):
    """One alert change delivered to one webhook: the unique key makes retries send it once."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="notifications")
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE)
    revision = models.PositiveIntegerField()
    state = models.CharField(max_length=16, default="pending")  # pending | sent | failed
    attempts = models.PositiveIntegerField(default=0)
    sent_at = models.DateTimeField(null=True)
    last_error = models.TextField(blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["alert", "webhook", "revision"], name="notify_once")]


class Baseline(models.Model):
    """Run `run` is compared step by step against `baseline` (chosen by a user)."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="baseline_link")
    baseline = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="baseline_for")
    chosen_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)


class DetailRequest(models.Model):
    """The server wants one rank's per-parameter fingerprints of one step (to name the parameters
    behind a grad divergence). Handed to the rank in its next ingest reply, answered by `detail` events."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE)
    rank = models.PositiveIntegerField()
    step = models.BigIntegerField()
    group = models.CharField(max_length=64)
    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="detail_requests")
    asked_at = models.DateTimeField(null=True)
    answered_at = models.DateTimeField(null=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "rank", "step", "group"], name="detail_once")]
        indexes = [models.Index(fields=["run", "rank"], condition=models.Q(asked_at__isnull=True), name="detail_unasked")]
