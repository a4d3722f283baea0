"""When ingest last turned a project's batches away for load (a 503: the server shedding load, a
project's bodies past its share, a busy or unreachable database): a rank whose batches the server
refused looks silent without being so.

Detection measures a rank's silence from this moment at the latest (`rules.rank_silent`): at 100,000
ranks, shedding during a job's start made hundreds of ranks look silent and paged for each. A
refusal whose project is known counts for that project only, so one project's flood never holds
another's silent ranks back; one refused before its project is known (a process past its shedding
point answers before reading the token) counts for every project, whose batches it may have been.
Kept in Redis, each key written at most once a second per process (a shedding server refuses many
requests a second).
"""

from __future__ import annotations

import logging
import math
import time

import redis

from ingest import ratelimit

log = logging.getLogger(__name__)

KEY = "lockstep:ingest:shed_at"  # any project's; a project's own is KEY:<project id>
WRITE_EVERY_S = 1.0
_written_at: dict[str, float] = {}  # key -> this process's last write (monotonic)


def _key(project_id: int | None) -> str:
    return KEY if project_id is None else f"{KEY}:{project_id}"


def refused(project_id: int | None) -> None:
    """A request of this project (None: not known yet) was refused for load now."""
    key, now = _key(project_id), time.monotonic()
    if now - _written_at.get(key, -math.inf) < WRITE_EVERY_S:
        return
    _written_at[key] = now
    try:
        ratelimit.client().set(key, repr(time.time()))
    except redis.RedisError:
        log.warning("redis unavailable: the shed is not recorded", exc_info=True)


def seconds_since(project_id: int) -> float:
    """Seconds since ingest last refused a batch of this project for load, or one whose project it
    did not know yet (infinite: never, or not known)."""
    try:
        stamps = ratelimit.client().mget([KEY, _key(project_id)])
    except redis.RedisError:
        return math.inf
    at = max((float(t) for t in stamps if t), default=None)
    return math.inf if at is None else max(0.0, time.time() - at)
