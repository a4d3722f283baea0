"""When ingest last turned batches away for load (a 503 of `ingest.backpressure`'s shedding, or of a
busy database), cluster-wide: a rank whose batches the server refused looks silent without being so.

Detection measures a rank's silence from this moment at the latest (`rules.rank_silent`): at 100,000
ranks, shedding during a job's start made hundreds of ranks look silent and paged for each. Kept in
Redis, written at most once a second per process (a shedding server refuses many requests a second).
"""

from __future__ import annotations

import logging
import math
import time

import redis

from ingest import ratelimit

log = logging.getLogger(__name__)

KEY = "lockstep:ingest:shed_at"
WRITE_EVERY_S = 1.0
_written_at = -math.inf  # this process's last write (monotonic)


def refused() -> None:
    """A request was refused for load now."""
    global _written_at
    now = time.monotonic()
    if now - _written_at < WRITE_EVERY_S:
        return
    _written_at = now
    try:
        ratelimit.client().set(KEY, repr(time.time()))
    except redis.RedisError:
        log.warning("redis unavailable: the shed is not recorded", exc_info=True)


def seconds_since() -> float:
    """Seconds since ingest last refused a batch for load (infinite: never, or not known)."""
    try:
        at = ratelimit.client().get(KEY)
    except redis.RedisError:
        return math.inf
    return max(0.0, time.time() - float(at)) if at else math.inf
