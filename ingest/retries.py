"""When a group's transaction is tried again, and when the database's refusal is no batch's fault.

Its own module because it is a policy about PostgreSQL's error codes, not about what a batch
writes: `ingest.writers` asks it inside its group loop, `ingest.admission` to answer 503.
"""

from __future__ import annotations

import random
import time

from django.db import DatabaseError

RACE_SQLSTATES = {"40P01", "40001"}  # deadlock_detected, serialization_failure
BUSY_SQLSTATES = {"55P03", "57014"}  # lock_not_available (lock_timeout), query_canceled (statement_timeout)
RACE_ATTEMPTS = 3


def busy(exc: DatabaseError) -> bool:
    """The database bounded a wait (LOCKSTEP_DB_LOCK_TIMEOUT, LOCKSTEP_DB_STATEMENT_TIMEOUT): answered
    503 + Retry-After, the batch kept by its agent, the writer free for the next group."""
    return getattr(exc.__cause__, "sqlstate", None) in BUSY_SQLSTATES


def lost_a_race(exc: DatabaseError) -> bool:
    """PostgreSQL rolled the batch back whole to let a concurrent one through: trying again is safe
    and nearly always succeeds, so the agent is not sent a 503 and a resend for it."""
    return getattr(exc.__cause__, "sqlstate", None) in RACE_SQLSTATES


def back_off(attempt: int) -> None:
    """A short random wait before the next attempt: the other transaction commits meanwhile."""
    time.sleep(random.uniform(0, 0.02 * attempt))
