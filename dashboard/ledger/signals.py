"""What the ledger announces, for detection to act on (detection subscribes; the ledger knows no subscriber).

Both are sent by ingest after its batch committed, from the request that completed something.
"""

from __future__ import annotations

from django.dispatch import Signal

slots_ready = Signal()  # ready: list[(kind, slot id, run id)], slots every rank has now reported
details_received = Signal()  # run_id, rank, steps: a rank answered detail requests of these steps
flight_records_received = (
    Signal()
)  # run_id, rank, asked: a rank's Flight Recorder dump answered (alert, revision) requests


def announce_ready(ready: list[tuple[str, int, int]]) -> None:
    if ready:
        slots_ready.send(sender=None, ready=ready)


def announce_details(run_id: int, rank: int, steps: set[int]) -> None:
    if steps:
        details_received.send(sender=None, run_id=run_id, rank=rank, steps=steps)


def announce_flight_record(run_id: int, rank: int, asked: list[tuple[int, int]]) -> None:
    flight_records_received.send(sender=None, run_id=run_id, rank=rank, asked=asked)
