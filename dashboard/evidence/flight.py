"""Flight Recorder dumps as the ranks sent them: the newest `FlightRecord.KEEP` per run and rank."""

from __future__ import annotations

from typing import Any

from dashboard.evidence.models import FlightRecord
from dashboard.tenancy.models import Run


def keep(run: Run, rank: int, session: str, ts: float, dump: dict[str, Any]) -> None:
    """Store one rank's dump and drop that rank's older ones past KEEP (inside the caller's transaction)."""
    FlightRecord.objects.create(
        run=run, rank=rank, session=session, ts=ts, entries=len(dump.get("entries", ())), dump=dump
    )
    old = FlightRecord.objects.filter(run=run, rank=rank).order_by("-received", "-id").values_list("id", flat=True)
    FlightRecord.objects.filter(id__in=list(old[FlightRecord.KEEP :])).delete()
