"""Per-project load shedding: at most LOCKSTEP_RATE_LIMIT batches per second, else 429 + Retry-After.

A fixed one-second window counted in Redis (INCR + EXPIRE in one round trip), shared by every
ingest process. If Redis is unreachable the limiter lets requests through: shedding is a
protection, and refusing all ingest because the counter is down would lose more than it saves.
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
    global _client
    if _client is None:
        # no retries: with Redis down every request would otherwise wait out redis-py's backoff
        _client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=0.25, socket_connect_timeout=0.25,
                                       retry=Retry(NoBackoff(), 0))
    return _client


def over_limit(project_id: int) -> bool:
    limit = settings.LOCKSTEP_RATE_LIMIT
    if limit <= 0:
        return False
    key = f"lockstep:rate:{project_id}:{int(time.time())}"
    try:
        pipe = client().pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, 2)
        count, _ = pipe.execute()
    except redis.RedisError:
        log.warning("rate limiter unavailable; admitting", exc_info=True)
        return False
    return count > limit
