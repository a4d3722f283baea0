"""Alerts and what shapes them: silences (who muted what, until when) and baselines (which run a
run is held against). Only `dashboard.detection.lifecycle` writes alerts.
"""
from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models

from dashboard.tenancy.models import Project, Run


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
        db_table = "dashboard_alert"
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

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="silences")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE)
    kind = models.CharField(max_length=64, blank=True)
    rank = models.PositiveIntegerField(null=True, blank=True)
    expires_at = models.DateTimeField()
    comment = models.TextField()
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "dashboard_silence"
        ordering = ["-created_at"]


class Baseline(models.Model):
    """Run `run` is compared step by step against `baseline` (chosen by a user)."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="baseline_link")
    baseline = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="baseline_for")
    chosen_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "dashboard_baseline"


class RunTally(models.Model):
    """A run's compile totals over all its ranks, as the periodic check last counted them (`tally.py`):
    /metrics reads one row per run instead of every rank's compile events at every scrape."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True, related_name="tally")
    recompiles = models.BigIntegerField(default=0)
    graph_breaks = models.BigIntegerField(default=0)
    compile_seconds = models.FloatField(default=0.0)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "detection_runtally"
