"""What the alerts and rank pages list: alerts of the caller's projects, narrowed by the page's filters.

Acknowledging and silencing are shared with the API and live in `dashboard.web.services`.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from dashboard.detection import silences
from dashboard.detection.models import Alert, Silence
from dashboard.tenancy.auth import Principal

UNRESOLVED = "unresolved"  # the page's default state: firing or ended unresolved, what `lockstep check` counts
UNRESOLVED_STATES = (Alert.State.FIRING, Alert.State.ENDED_UNRESOLVED)


def alerts_for(caller: Principal, filters: dict[str, Any]) -> QuerySet[Alert]:
    """Alerts of the caller's projects narrowed by the page's filters (run, kind, severity, state, acked);
    `unresolved` (the default) is firing or ended unresolved, a state one of those, anything else all."""
    qs = Alert.objects.filter(run__project_id__in=caller.project_ids).select_related("run", "run__project", "acked_by")
    if filters.get("run"):
        qs = qs.filter(run__key=filters["run"])
    if filters.get("kind"):
        qs = qs.filter(kind=filters["kind"])
    if filters.get("severity"):
        qs = qs.filter(severity=filters["severity"])
    state = filters.get("state", UNRESOLVED)
    if state == UNRESOLVED:
        qs = qs.filter(state__in=UNRESOLVED_STATES)
    elif state in Alert.State.values:
        qs = qs.filter(state=state)
    if filters.get("acked") == "yes":
        qs = qs.filter(acked_at__isnull=False)
    elif filters.get("acked") == "no":
        qs = qs.filter(acked_at__isnull=True)
    return qs


def active_silences(caller: Principal) -> QuerySet[Silence]:
    return silences.active(caller.project_ids).select_related("project", "run", "author")


def kinds_of(caller: Principal) -> list[str]:
    return list(
        Alert.objects.filter(run__project_id__in=caller.project_ids)
        .values_list("kind", flat=True)
        .distinct()
        .order_by("kind")
    )


def involving_rank(qs: QuerySet[Alert], rank: int) -> QuerySet[Alert]:
    return qs.filter(ranks__contains=[rank])
