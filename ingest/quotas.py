"""Bounds on the rows one project's token can make: new runs within an hour, ranks of a run; and on
the bytes its uploads keep: graph texts and Flight Recorder dumps.

Each run costs rows in every app and each rank a row per run (and a line on its pages), so a token
that makes run keys without end, or names a world of a million ranks, would fill the tables and make
the pages slow for everybody. Past LOCKSTEP_RUNS_PER_HOUR new runs the project's batches of new
runs are 429 with Retry-After (the seconds until its oldest run of the hour leaves the window; its
runs already made go on); a world_size past LOCKSTEP_MAX_RANKS is a 400 naming `run.world_size`
(every rank is below the world size, so no rank past it gets in either). Nothing of a refused batch
is stored.

Uploads' bytes: graph texts (`ingest.blobs`) and Flight Recorder dumps (`ingest.flight`) share one
quota, LOCKSTEP_BLOB_QUOTA in all and LOCKSTEP_BLOB_QUOTA_DAY within a day: either fills the disk
alike. An upload that would cross it is refused (507 for the total, 429 for the day) and nothing of
it stored; past it, no text is asked for.
"""

from __future__ import annotations

import math
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from agents import protocol
from dashboard.evidence import blobs, flight
from dashboard.tenancy.models import Project, Run
from ingest.refusals import Refusal

WINDOW = timedelta(hours=1)


def check_ranks(batch: protocol.Batch) -> None:
    """A 400 for a run wider than LOCKSTEP_MAX_RANKS, before anything is written."""
    limit = settings.LOCKSTEP_MAX_RANKS
    if batch.run.world_size > limit:
        raise Refusal(
            400,
            f"world_size {batch.run.world_size} exceeds this server's LOCKSTEP_MAX_RANKS ({limit}): "
            f"its operator sets LOCKSTEP_MAX_RANKS={batch.run.world_size} or more to take this job",
            "run.world_size",
        )


def check_new_run(project: Project) -> None:
    """Before the project's next run is made: a 429 once it made LOCKSTEP_RUNS_PER_HOUR (0: no bound)
    within the hour. One query, only when a batch names a run that does not exist yet."""
    limit = settings.LOCKSTEP_RUNS_PER_HOUR
    if limit <= 0:
        return
    since = timezone.now() - WINDOW
    newest = Run.objects.filter(project=project, started_at__gt=since).order_by("-started_at")
    oldest_counted = newest.values_list("started_at", flat=True)[limit - 1 : limit].first()
    if oldest_counted is None:
        return
    wait = max(1, math.ceil((oldest_counted - since).total_seconds()))
    raise Refusal(
        429,
        f"project {project.name} made {limit} runs within the hour (LOCKSTEP_RUNS_PER_HOUR); "
        f"a new run is taken again in {wait} s",
        "run.key",
        retry_after=wait,
    )


def stored_bytes(project_id: int) -> tuple[int, int]:
    """(bytes the project's uploads keep in all, of those stored within a day): graph texts and dumps."""
    texts, dumps = blobs.stored_bytes(project_id), flight.stored_bytes(project_id)
    return texts[0] + dumps[0], texts[1] + dumps[1]


def bytes_full(project_id: int) -> bool:
    """The project reached a byte quota: nothing more is asked of it."""
    total, day = stored_bytes(project_id)
    return total >= settings.LOCKSTEP_BLOB_QUOTA or day >= settings.LOCKSTEP_BLOB_QUOTA_DAY


def check_bytes(project_id: int, what: str) -> None:
    """After an upload of `what` is written, in its transaction: 507 once the project's uploads keep
    more than LOCKSTEP_BLOB_QUOTA, 429 more than LOCKSTEP_BLOB_QUOTA_DAY within a day, rolling it back."""
    total, day = stored_bytes(project_id)
    if total > settings.LOCKSTEP_BLOB_QUOTA:
        raise Refusal(
            507,
            f"the project's graph texts and Flight Recorder dumps would exceed LOCKSTEP_BLOB_QUOTA "
            f"({settings.LOCKSTEP_BLOB_QUOTA} bytes); {what} not stored, and not needed",
        )
    if day > settings.LOCKSTEP_BLOB_QUOTA_DAY:
        raise Refusal(
            429,
            f"the project's graph texts and Flight Recorder dumps of the last day would exceed "
            f"LOCKSTEP_BLOB_QUOTA_DAY ({settings.LOCKSTEP_BLOB_QUOTA_DAY} bytes); {what} not stored, and not needed",
        )
