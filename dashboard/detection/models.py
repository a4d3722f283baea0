"""Alerts, the incidents that group them by cause, and what shapes them: silences (who muted what,
until when) and baselines (which run a run is held against). Only `dashboard.detection.lifecycle`
writes alerts, and only `dashboard.detection.incidents` writes incidents.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Count, Q

from dashboard.detection.remedies import incident_remedy
from dashboard.ledger.models import GradSlot
from dashboard.ledger.slots import PARAM_PREFIX
from dashboard.tenancy.models import Project, Run


class Alert(models.Model):
    """One desync: identity (run, kind, subject); ranks and steps it spans live in the body."""

    class State(models.TextChoices):
        FIRING = "firing", "firing"
        RESOLVED = "resolved", "resolved"  # fixed: it got better, or a person closed it
        ENDED_UNRESOLVED = "ended_unresolved", "ended unresolved"  # the run ended first: it still counts

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
    incident = models.ForeignKey("Incident", null=True, blank=True, on_delete=models.SET_NULL, related_name="alerts")
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    resolve_reason = models.TextField(blank=True)  # "run ended", "by hand: ...": empty when a clean slot resolved it

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "kind", "subject"], name="alert_identity")]
        ordering = ["-first_seen"]

    def as_json(self) -> dict[str, Any]:
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
            "incident": self.incident_id,
            "resolve_reason": self.resolve_reason or None,
            "resolved_by": self.resolved_by.get_username() if self.resolved_by is not None else None,
        }


class Incident(models.Model):
    """One cause and everything it set off: the unit that pages. `root` is the alert where the
    trouble started (a rank that died, a rank that compiled alone); the incident's other alerts are
    its consequences (peers that lost the connection, the cache miss of that compile). `cause` is the
    grouping key inside the run (`incidents.cause_of`). Delivery is an outbox, as for alerts."""

    class State(models.TextChoices):
        FIRING = "firing", "firing"
        RESOLVED = "resolved", "resolved"
        ENDED_UNRESOLVED = "ended_unresolved", "ended unresolved"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="incidents")
    cause = models.CharField(max_length=600)
    root = models.ForeignKey(Alert, null=True, on_delete=models.SET_NULL, related_name="+")
    state = models.CharField(max_length=16, choices=State.choices, default=State.FIRING)
    severity = models.CharField(max_length=16)
    opened_at = models.DateTimeField(auto_now_add=True)
    last_change = models.DateTimeField(auto_now=True)
    resolved_at = models.DateTimeField(null=True)
    acked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    acked_at = models.DateTimeField(null=True)
    revision = models.PositiveIntegerField(default=1)  # bumped on every change worth a page
    notified_revision = models.PositiveIntegerField(default=0)
    _members: list[Alert]  # not a field: its alerts, fetched once per send (`delivery.transports.members`)

    class Meta:
        db_table = "detection_incident"
        ordering = ["-opened_at"]
        indexes = [models.Index(fields=["run", "state"], name="incident_run_state")]

    def as_json(self, alerts: list[Alert] | None = None) -> dict[str, Any]:
        """The incidents API's shape; `alerts`: this incident's alerts when the caller has them."""
        members = alerts if alerts is not None else list(self.alerts.order_by("first_seen", "id"))
        root = self.root
        return {
            "id": self.id,
            "run": self.run.key,
            "state": self.state,
            "severity": self.severity,
            "root": {
                "kind": root.kind,
                "ranks": sorted(root.ranks),
                "step": root.step,
                "frame": root.frame,
                "message": root.message,
                "alert": root.id,
                "resolve_reason": root.resolve_reason or None,
            }
            if root
            else None,
            "remedy": remedy_of(root) if root else None,
            "alerts": [a.id for a in members],
            "consequences": [
                {
                    "id": a.id,
                    "kind": a.kind,
                    "ranks": sorted(a.ranks),
                    "state": a.state,
                    "severity": a.severity,
                    "message": a.message,
                }
                for a in members
                if root is None or a.id != root.id
            ],
            "opened_at": self.opened_at.isoformat(),
            "resolved_at": self.resolved_at.isoformat() if self.resolved_at else None,
            "acked_by": self.acked_by.get_username() if self.acked_by else None,
            "acked_at": self.acked_at.isoformat() if self.acked_at else None,
            "revision": self.revision,
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
        ordering = ["-created_at"]


class Baseline(models.Model):
    """Run `run` is compared step by step against `baseline` (chosen by a user)."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="baseline_link")
    baseline = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="baseline_for")
    chosen_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)


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


class RunCost(models.Model):
    """A run's compile bill as last computed (`cost.py`, kept by `bills.py`): the project's cost page
    reads its frames, and /metrics sums `counted` over runs: per cause the most the bill ever
    counted, so the counter never goes down when a later look files a compile under another cause."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True, related_name="compile_cost")
    gpu_seconds = models.FloatField(default=0.0)
    counted = models.JSONField(default=dict)  # cause -> GPU-seconds
    frames = models.JSONField(default=list)  # the costliest frames: frame, label, gpu_seconds, cause, reason, remedy
    bill = models.JSONField(default=dict)  # the whole bill as computed (`cost.compute`'s shape)
    compile_seconds = models.FloatField(
        default=0.0
    )  # the run's compile seconds when computed: newer compiles make it stale
    computed_at = models.DateTimeField()

    class Meta:
        db_table = "detection_runcost"


def remedy_of(root: Alert) -> dict[str, Any]:
    """What to do about an incident rooted at `root` ({text, doc}): the page, the API and every sink say it."""
    return incident_remedy(root.kind, root.details, weights_parted(root), root.ranks)


def weights_parted(alert: Alert) -> str:
    """How the weights of a `param_divergence` came apart, from its group's slots up to its step (a
    weight fingerprint of step S is taken after S's update): "update" if every gradient compared agreed
    and the weights had agreed at an earlier fingerprint (the optimizer's step differed: a rank's
    learning rate, say), "first" if every gradient compared agreed and no earlier fingerprint did (that
    too, or the ranks started from different weights), else "" (a gradient differed, or none was compared)."""
    group = (alert.details or {}).get("group")
    if alert.kind != "param_divergence" or not isinstance(group, str) or alert.step is None:
        return ""
    compared = GradSlot.objects.filter(run_id=alert.run_id, step__lte=alert.step, settled_at__isnull=False).exclude(
        consensus={}
    )
    counts = compared.aggregate(
        grads=Count("id", filter=Q(group=group)),
        grads_differed=Count("id", filter=Q(group=group) & ~Q(dissenters=[])),
        weights_agreed=Count("id", filter=Q(group=PARAM_PREFIX + group, step__lt=alert.step, dissenters=[])),
    )
    if not counts["grads"] or counts["grads_differed"]:
        return ""
    return "update" if counts["weights_agreed"] else "first"
