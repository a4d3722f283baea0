"""A run's start facts as its ranks share them: one row per distinct `Rank.facts_key`, its facts read
from one rank of the group.

A real rank's facts are about a kilobyte, stored out of line and compressed (`0002_rank_facts`); the
ranks of a job share all of them but their own few (`OWN_FACTS`), so a job is one group, or a few where
ranks were set up apart (agents before 2026-12-07 also sent a local cache's filesystem id: a group per
node). Each group's facts are fetched and decompressed once, not every rank's (`0004_rank_facts_key`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from django.db import connection

from dashboard.tenancy.models import Rank

RANK = Rank._meta.db_table

# Per group: `keys` of one rank's facts (those it has; jsonb_each decompresses them once, where each
# operator on the column would again), the group's ranks, their hosts and devices (the small columns).
GROUPS = f"""
        SELECT (SELECT jsonb_object_agg(key, value) FROM jsonb_each(r.facts) WHERE key = ANY(%(keys)s::text[])),
               g.ranks, g.hosts, g.devices
        FROM (SELECT min(id) AS first, array_agg(rank) AS ranks, array_agg(host) AS hosts,
                     array_agg(device) AS devices
              FROM {RANK} WHERE run_id = %(run)s GROUP BY facts_key) g
        JOIN {RANK} r ON r.id = g.first"""


def groups(run_id: int, keys: Sequence[str]) -> list[tuple[dict[str, Any], list[int], list[str], list[str]]]:
    """(`keys` of the group's facts, its ranks, their hosts, their devices) for each group of the run's ranks."""
    with connection.cursor() as cursor:
        cursor.execute(GROUPS, {"run": run_id, "keys": list(keys)})
        rows = cursor.fetchall()
    # Django's cursor hands jsonb over as its text
    return [({} if picked is None else msgspec.json.decode(picked), *rest) for picked, *rest in rows]
