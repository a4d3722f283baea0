"""Flight Recorder dumps as the ranks sent them: the newest `FlightRecord.KEEP` per run and rank."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from dashboard.evidence.models import FlightRecord
from dashboard.tenancy.models import Run


def keep(run: Run, rank: int, session: str, ts: float, dump: dict[str, Any], size: int) -> None:
    """Store one rank's dump (`size`: its upload's bytes) and drop that rank's older ones past KEEP
    (inside the caller's transaction)."""
    FlightRecord.objects.create(
        run=run, rank=rank, session=session, ts=ts, entries=len(dump.get("entries", ())), size=size, dump=dump
    )
    old = FlightRecord.objects.filter(run=run, rank=rank).order_by("-received", "-id").values_list("id", flat=True)
    FlightRecord.objects.filter(id__in=list(old[FlightRecord.KEEP :])).delete()


def stored_bytes(project_id: int) -> tuple[int, int]:
    """(bytes of the dumps the project keeps in all, of those received within a day)."""
    day = Q(received__gt=timezone.now() - timedelta(days=1))
    sums = FlightRecord.objects.filter(run__project_id=project_id).aggregate(
        total=Coalesce(Sum("size"), 0), day=Coalesce(Sum("size", filter=day), 0)
    )
    return sums["total"], sums["day"]
