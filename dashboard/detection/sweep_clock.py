"""When the detection sweep (`tasks.sweep`) last completed, kept in Redis: `/metrics` shows its age
(`lockstep_sweep_age_seconds`) and a live run's page warns once it is stale. Without it, a sweep that
stopped (no beat sends it, no worker runs it) stops overdue slots, silent ranks and webhook retries
without a word."""

from __future__ import annotations

import logging
import math
import time

import redis
from django.conf import settings

from ingest import ratelimit

KEY = "lockstep:sweep:completed"
STALE_PERIODS = 5  # sweeps missed in a row before it counts as stopped (one late sweep is not news)

log = logging.getLogger(__name__)


def mark() -> None:
    """The sweep just completed (the wall clock: hosts keep it within far less than a period)."""
    ratelimit.client().set(KEY, repr(time.time()))


def age() -> float | None:
    """Seconds since the last sweep completed; infinite if none ever did; None if Redis did not answer."""
    try:
        value = ratelimit.client().get(KEY)
    except redis.RedisError:
        log.warning("redis unavailable for the sweep's age", exc_info=True)
        return None
    return math.inf if value is None else max(0.0, time.time() - float(value))


def stale_after() -> float:
    """Seconds without a completed sweep past which it counts as stopped: a few of beat's periods."""
    return STALE_PERIODS * settings.SWEEP_PERIOD_S


def stale() -> float | None:
    """The sweep's age if it is stale (inf: none ever completed), else None (fresh, or Redis did not answer)."""
    seconds = age()
    return seconds if seconds is not None and seconds > stale_after() else None
