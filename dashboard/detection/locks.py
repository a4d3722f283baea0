"""Detection's own locks: PostgreSQL advisory locks held to the end of the caller's transaction.

Why not row locks: ingest writes the rows detection reads (a slot's `reported`, the run's liveness)
from every ingest process, many times a second at scale. A settle that held its slot row (and,
through `select_related`, its run row) while it read a 100,000-rank slot made every ingest
transaction of the run wait, past its lock timeout. These locks are detection's alone, so ingest
never waits on them; they only keep detection's own writers of one slot, or of one run's alerts
and incidents, one at a time.

Order, so two holders cannot deadlock: a slot's settle lock, then its run's alert lock; a run's
check lock, then its alert lock.
"""

from __future__ import annotations

from django.db import connection, transaction

SETTLE_COMPILE = 1  # one settle of a compile slot at a time
SETTLE_GRAD = 2  # one settle of a grad slot at a time
RUN_ALERTS = 3  # one writer of a run's alerts and incidents at a time (two would open two incidents)
RUN_CHECK = 4  # one periodic check of a run at a time: a sweep that overlaps the last one skips it

_KEY_SPACE = 2**31  # the two-key form takes int4 keys; ids past it share a lock with another, which only waits


def hold(space: int, key: int) -> None:
    """Wait for the lock (`space`, `key`) and hold it until the transaction ends."""
    assert transaction.get_connection().in_atomic_block
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [space, key % _KEY_SPACE])


def try_hold(space: int, key: int) -> bool:
    """Take the lock if no other transaction holds it; False, at once, if one does."""
    assert transaction.get_connection().in_atomic_block
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [space, key % _KEY_SPACE])
        return bool(cursor.fetchone()[0])
