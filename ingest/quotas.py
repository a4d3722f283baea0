"""Bounds on the rows one project's token can make: new runs within an hour, ranks of a run.

Each run costs rows in every app and each rank a row per run (and a line on its pages), so a token
that makes run keys without end, or names a world of a million ranks, would fill the tables and make
the pages slow for everybody. Past LOCKSTEP_RUNS_PER_HOUR new runs the project's batches of new
runs are 429 with Retry-After (the seconds until its oldest run of the hour leaves the window; its
runs already made go on); a world_size past LOCKSTEP_MAX_RANKS is a 400 naming `run.world_size`
(every rank is below the world size, so no rank past it gets in either). Nothing of a refused batch
is stored.
"""

from __future__ import annotations

import math
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from agents import protocol
from dashboard.tenancy.models import Project, Run
from ingest.refusals import Refusal

WINDOW = timedelta(hours=1)


def check_ranks(batch: protocol.Batch) -> None:
    """A 400 for a run wider than LOCKSTEP_MAX_RANKS, before anything is written."""
    limit = settings.LOCKSTEP_MAX_RANKS
    if batch.run.world_size > limit:
        raise Refusal(
            400,
            f"world_size {batch.run.world_size} exceeds this server's LOCKSTEP_MAX_RANKS ({limit})",
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
