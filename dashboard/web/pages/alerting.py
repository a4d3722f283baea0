"""Acknowledge and silence: the thin write side shared by the alerts page and the JSON API.

The lifecycle (ack expiring on resolve, silence matching for notifications, inhibition) is
the detection package's job; here a user only records intent on alerts of their projects.
"""
from __future__ import annotations

import logging
from datetime import timedelta

from django import forms
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from dashboard.delivery import notify
from dashboard.detection import lifecycle
from dashboard.detection.models import Alert, Silence
from dashboard.tenancy.models import Run

log = logging.getLogger(__name__)
MAX_SILENCE_HOURS = 24 * 30


class SilenceForm(forms.Form):
    """A matcher (run, kind, rank; blank = any), a duration and a mandatory comment."""

    run = forms.CharField(required=False, max_length=200)
    kind = forms.CharField(required=False, max_length=64)
    rank = forms.IntegerField(required=False, min_value=0)
    hours = forms.FloatField(min_value=0.01, max_value=MAX_SILENCE_HOURS, initial=2)
    comment = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))
    project = forms.CharField(required=False, max_length=100)


def alerts_for(project_ids, filters: dict) -> QuerySet[Alert]:
    """Alerts of the user's projects narrowed by the page's filters (run, kind, severity, state, acked)."""
    qs = Alert.objects.filter(run__project_id__in=project_ids).select_related("run", "run__project", "acked_by")
    if filters.get("run"):
        qs = qs.filter(run__key=filters["run"])
    if filters.get("kind"):
        qs = qs.filter(kind=filters["kind"])
    if filters.get("severity"):
        qs = qs.filter(severity=filters["severity"])
    state = filters.get("state", "firing")
    if state in (Alert.State.FIRING, Alert.State.RESOLVED):
        qs = qs.filter(state=state)
    if filters.get("acked") == "yes":
        qs = qs.filter(acked_at__isnull=False)
    elif filters.get("acked") == "no":
        qs = qs.filter(acked_at__isnull=True)
    return qs


def active_silences(project_ids) -> QuerySet[Silence]:
    return (Silence.objects.filter(project_id__in=project_ids, expires_at__gt=timezone.now())
            .select_related("project", "run", "author"))


def silenced_by(alert: Alert, silences: list[Silence]) -> Silence | None:
    """Display only: which active silence covers this alert, in memory for a page of alerts
    (the same matcher as dashboard.detection.silences.matching, which decides notifications)."""
    for s in silences:
        if (s.project_id == alert.run.project_id and (s.run_id is None or s.run_id == alert.run_id)
                and (not s.kind or s.kind == alert.kind) and (s.rank is None or s.rank in alert.ranks)):
            return s
    return None


def _push(alert: Alert) -> None:
    """Best effort: open run pages show the new ack state live; the stored state is what counts."""
    try:
        notify.push([alert])
    except Exception:
        log.warning("websocket push of alert %s failed", alert.id, exc_info=True)


def acknowledge(alert: Alert, user) -> Alert:
    with transaction.atomic():
        lifecycle.acknowledge(alert, user)
        transaction.on_commit(lambda: _push(alert))
    return alert


def unacknowledge(alert: Alert) -> Alert:
    with transaction.atomic():
        alert.acked_by, alert.acked_at = None, None
        alert.save(update_fields=["acked_by", "acked_at"])
        transaction.on_commit(lambda: _push(alert))
    return alert


def create_silence(data: dict, user, project_ids, default_project: int | None = None) -> Silence | str:
    """A Silence from cleaned form data, or the reason it cannot be made (unknown run, no project)."""
    run = None
    if data.get("run"):
        run = Run.objects.filter(key=data["run"], project_id__in=project_ids).first()
        if run is None:
            return f"no run {data['run']!r} in your projects"
    project_id = run.project_id if run else default_project
    if project_id is None and data.get("project"):
        from dashboard.tenancy.models import Project

        project_id = Project.objects.filter(name=data["project"], id__in=project_ids).values_list("id", flat=True).first()
    if project_id is None and len(project_ids) == 1:
        project_id = next(iter(project_ids))
    if project_id is None or project_id not in project_ids:
        return "choose a run or a project of yours"
    return Silence.objects.create(
        project_id=project_id, run=run, kind=data.get("kind") or "", rank=data.get("rank"),
        expires_at=timezone.now() + timedelta(hours=data["hours"]), comment=data["comment"], author=user,
    )


def expire_silence(silence: Silence) -> None:
    silence.expires_at = timezone.now()
    silence.save(update_fields=["expires_at"])


def silence_json(s: Silence) -> dict:
    return {
        "id": s.id, "project": s.project.name, "run": s.run.key if s.run else None, "kind": s.kind or None,
        "rank": s.rank, "expires_at": s.expires_at.isoformat(), "comment": s.comment,
        "author": s.author.get_username() if s.author else None, "created_at": s.created_at.isoformat(),
    }


def kinds_of(project_ids) -> list[str]:
    return list(Alert.objects.filter(run__project_id__in=project_ids).values_list("kind", flat=True)
                .distinct().order_by("kind"))


def involving_rank(qs: QuerySet[Alert], rank: int) -> QuerySet[Alert]:
    return qs.filter(Q(ranks__contains=[rank]))
