"""Which alerts are muted: by a silence (matchers + expiry) or inhibited by their rank going silent.

Muted alerts are still stored and shown (marked); they only skip notifications.
"""
from __future__ import annotations

from django.db.models import Q
from django.utils import timezone

from dashboard.detection.models import Alert, Silence


def active(project_id: int):
    return Silence.objects.filter(project_id=project_id, expires_at__gt=timezone.now())


def matching(alert: Alert) -> list[Silence]:
    candidates = active(alert.run.project_id).filter(Q(run__isnull=True) | Q(run_id=alert.run_id))
    candidates = candidates.filter(Q(kind="") | Q(kind=alert.kind))
    return [s for s in candidates if s.rank is None or s.rank in alert.ranks]


def silent_ranks(run_id: int) -> set[int]:
    firing = Alert.objects.filter(run_id=run_id, kind="rank_silent", state=Alert.State.FIRING)
    return {rank for ranks in firing.values_list("ranks", flat=True) for rank in ranks}


def inhibited(alert: Alert) -> bool:
    """rank_silent inhibits alerts that are only about silent ranks."""
    if alert.kind == "rank_silent" or not alert.ranks:
        return False
    return set(alert.ranks) <= silent_ranks(alert.run_id)


def mute_state(alert: Alert) -> dict:
    silences = matching(alert)
    return {"silenced": bool(silences), "silenced_by": [s.id for s in silences], "inhibited": inhibited(alert)}
