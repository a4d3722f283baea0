"""What the claims table (`IngestSession`: one row per agent session) says of the batches a test sent,
read back a batch at a time."""

from __future__ import annotations

from typing import Any

from dashboard.evidence.models import IngestSession


def pairs(**filters: Any) -> list[tuple[str, int]]:
    """(session, seq) of every claimed batch, in order."""
    return sorted(
        (session, seq)
        for session, seqs in IngestSession.objects.filter(**filters).values_list("session", "seqs")
        for run in seqs
        for seq in range(run.lower, run.upper)
    )


def ranks(**filters: Any) -> list[int]:
    """The rank of every claimed batch (a session's rank for each of its batches), sorted."""
    rows = IngestSession.objects.filter(**filters).values_list("rank", "batches")
    return sorted(rank for rank, batches in rows for _ in range(batches))


def count(**filters: Any) -> int:
    return len(ranks(**filters))
