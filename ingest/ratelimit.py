"""Per-project load shedding: at most LOCKSTEP_RATE_LIMIT batches per second, else 429 + Retry-After.

A fixed one-second window counted in Redis (INCR + EXPIRE in one round trip), shared by every
ingest process, and counted once per group commit for all of a group's batches of a project
(`ingest.groupcommit`). The same round trip is the broker's health check: while Redis is unreachable the
batch is refused with 503 + Retry-After before anything is stored. Accepting would build a
backlog nobody settles or sheds (no detection, no live alerts, no rate limit); refusing costs
nothing, because the agent keeps the batch in its spool and resends it.
"""

from __future__ import annotations

import logging
import time

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger(__name__)
_client: redis.Redis | None = None


def client() -> redis.Redis:
    """The process's Redis client for rate windows and queue depth, made on first use."""
    global _client
    if _client is None:
        # no retries: with Redis down every request would otherwise wait out redis-py's backoff
        # 1 s: at 0.25 s a Redis starved of CPU by a saturated ingest host timed out mid-handshake
        _client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=1.0, socket_connect_timeout=1.0, retry=Retry(NoBackoff(), 0)
        )
    return _client


class BrokerDown(Exception):
    """Redis did not answer: the caller refuses the batch with 503."""


def over_limit(project_id: int, batches: int = 1) -> bool:
    """Count these batches in the project's window; raises BrokerDown when Redis is unreachable."""
    limit = settings.LOCKSTEP_RATE_LIMIT
    return 0 < limit < count(project_id, batches)


def count(project_id: int, batches: int) -> int:
    """Add these batches to the project's current window and return its count (an ingest group
    counts all of its batches of a project at once); raises BrokerDown when Redis is unreachable."""
    key = f"lockstep:rate:{project_id}:{int(time.time())}"
    try:
        return _count(key, batches)
    except _DOWN:
        # one more try on a fresh connection: a pooled socket that died under load (redis-py says
        # "I/O operation on closed file") is not an outage, and a real outage refuses at once
        client().connection_pool.disconnect()
        try:
            return _count(key, batches)
        except _DOWN as exc:
            log.warning("Redis unavailable: %s", exc)
            raise BrokerDown(str(exc)) from exc


# not only RedisError: a connection torn down mid-handshake (a timeout under load) surfaces from
# redis-py as OSError, "I/O operation on closed file" (ValueError) or a None socket buffer
_DOWN = (redis.RedisError, OSError, ValueError, AttributeError)


def _count(key: str, batches: int) -> int:
    pipe = client().pipeline(transaction=False)
    pipe.incrby(key, batches)
    pipe.expire(key, 2)
    count, _ = pipe.execute()
    return int(count)
