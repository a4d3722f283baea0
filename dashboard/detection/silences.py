"""Which alerts are muted: by a silence (matchers + expiry) or inhibited by their rank going silent or crashing.

Muted alerts are still stored and shown (marked); they only skip notifications. `covers` is the
one matcher: notifications (`matching`) and the alerts page (`first_covering`) both ask it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db.models import QuerySet
from django.utils import timezone

from dashboard.detection.models import Alert, Silence
from dashboard.tenancy.models import Run

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def active(project_ids: Collection[int]) -> QuerySet[Silence]:
    return Silence.objects.filter(project_id__in=project_ids, expires_at__gt=timezone.now())


def covers(silence: Silence, alert: Alert) -> bool:
    """Alertmanager-style matchers: a blank run, kind or rank matches anything; rank is one of the alert's."""
    return (
        silence.project_id == alert.run.project_id
        and (silence.run_id is None or silence.run_id == alert.run_id)
        and (not silence.kind or silence.kind == alert.kind)
        and (silence.rank is None or silence.rank in alert.ranks)
    )


def matching(alert: Alert) -> list[Silence]:
    return [s for s in active([alert.run.project_id]) if covers(s, alert)]


def first_covering(alert: Alert, silences: Iterable[Silence]) -> Silence | None:
    """For a page of alerts: match in memory against active silences fetched once."""
    return next((s for s in silences if covers(s, alert)), None)


def create(
    project_id: int, run: Run | None, kind: str, rank: int | None, until: datetime, comment: str, author: User | None
) -> Silence:
    return Silence.objects.create(
        project_id=project_id, run=run, kind=kind, rank=rank, expires_at=until, comment=comment, author=author
    )


def expire(silence: Silence) -> None:
    silence.expires_at = timezone.now()
    silence.save(update_fields=["expires_at"])


INHIBITING = ("rank_silent", "rank_crashed")  # alerts about a whole rank: its other alerts follow from them


def inhibiting_ranks(run_id: int) -> set[int]:
    """Ranks that went silent or crashed (a firing alert of an inhibiting kind names them)."""
    firing = Alert.objects.filter(run_id=run_id, kind__in=INHIBITING, state=Alert.State.FIRING)
    return {rank for ranks in firing.values_list("ranks", flat=True) for rank in ranks}


def inhibited(alert: Alert) -> bool:
    """rank_silent and rank_crashed inhibit alerts that are only about ranks that went silent or crashed."""
    if alert.kind in INHIBITING or not alert.ranks:
        return False
    return set(alert.ranks) <= inhibiting_ranks(alert.run_id)


def mute_state(alert: Alert) -> dict[str, Any]:
    silences = matching(alert)
    return {"silenced": bool(silences), "silenced_by": [s.id for s in silences], "inhibited": inhibited(alert)}
