"""Fair settling: one run's backlog never holds back another run's slots.

Settle messages share one Celery queue, so a project that floods it (thousands of compile slots at
once) would make every other project's slots wait behind its own. Each run's queued slots are
counted in Redis (`claim` as a chunk is queued, `release` once it is settled); a chunk of a run with
little queued goes at the top priority of settling (just below the pages, PAGES), a chunk of a run
with a backlog the lower the more it has queued (Celery's priorities: one Redis list per step, which
BRPOP serves top list first). A
slot of another run therefore passes the whole backlog and waits only for the tasks already in
progress; the flooding run still settles everything, in order, as the workers get to it. A count
left by a worker killed mid-task expires after BACKLOG_TTL_S.
"""

from __future__ import annotations

import logging

import redis

from ingest import ratelimit

PAGES = 0  # the broker's top: an alert's way to its destinations (`dashboard.delivery.tasks`) passes every settle
TOP = 1  # settling and every other task (CELERY_TASK_DEFAULT_PRIORITY)
PRIORITY_BY_BACKLOG = ((64, TOP), (1024, 3), (16_384, 6))  # (queued slots of the run below, priority); else 9
LOWEST = 9
BACKLOG_TTL_S = 120
BACKLOG_CHUNK = 8  # slots per message once a run has a backlog: a short task, so a newcomer's wait is short too

log = logging.getLogger(__name__)


def _key(run_id: int) -> str:
    return f"lockstep:settle-backlog:{run_id}"


def priority_for(queued: int) -> int:
    """The broker priority of a chunk queued behind `queued` slots of its own run (TOP: settling's top)."""
    return next((priority for below, priority in PRIORITY_BY_BACKLOG if queued < below), LOWEST)


def claim(run_id: int, n: int) -> int:
    """Count `n` more queued slots of the run; the priority their chunk goes at (the top if Redis is away:
    settling never waits on the count)."""
    try:
        pipe = ratelimit.client().pipeline()
        pipe.incrby(_key(run_id), n)
        pipe.expire(_key(run_id), BACKLOG_TTL_S)
        queued = int(pipe.execute()[0]) - n
    except redis.RedisError:
        log.warning("redis unavailable: settling run %d unranked", run_id, exc_info=True)
        return TOP
    return priority_for(queued)


def release(run_id: int, n: int) -> None:
    """`n` queued slots of the run were settled (or dropped)."""
    try:
        if int(ratelimit.client().decrby(_key(run_id), n)) < 0:
            ratelimit.client().delete(_key(run_id))
    except redis.RedisError:
        pass  # the count expires on its own
