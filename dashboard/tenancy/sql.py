"""The statements that write ranks and runs on ingest's behalf.

Ingest runs them inside its batch transaction (as server-side prepared statements, composed into
its claim statement where a round trip matters), but only this module names these tables.
"""

from __future__ import annotations

from dashboard.tenancy.models import LAYOUT, LOST, OWN_FACTS, VANISHED, Rank, Run

RANK = Rank._meta.db_table
RUN = Run._meta.db_table


def _keys(keys: tuple[str, ...]) -> str:
    """A `text[]` literal of jsonb keys, for `jsonb - text[]`."""
    return "'{" + ",".join(keys) + "}'::text[]"


def ranks_seen_cte(source: str) -> str:
    """CTE `ranked`: upsert each batch's rank facts from CTE `source` (run is %(run)s; columns rank, host,
    pid, info, step, progress): a rank_start's facts replace the old ones (and `facts`, the same without
    the parameter layout, with its key, the rank's device and collective timeout), the last step only
    moves forward, the batch's latest progress sample replaces the rank's (received now), and a rank
    the sweep had given up as lost is running again."""
    return f"""
            ranked AS (
              INSERT INTO {RANK} (run_id, rank, host, pid, info, facts, facts_key, device, collective_timeout_s,
                                  status, exit_code, last_step, last_seen, progress, progress_at)
              SELECT %(run)s::bigint, rank, host, pid, COALESCE(info::jsonb, '{{}}'::jsonb),
                COALESCE(info::jsonb, '{{}}'::jsonb) - {_keys(LAYOUT)},
                CASE WHEN info IS NULL THEN '' ELSE md5((info::jsonb - {_keys(LAYOUT)} - {_keys(OWN_FACTS)})::text) END,
                COALESCE(info::jsonb ->> 'device', ''), (info::jsonb ->> 'collective_timeout_s')::float8,
                'running', NULL, step, now(),
                progress::jsonb, CASE WHEN progress IS NULL THEN NULL ELSE now() END
              FROM {source} ORDER BY rank
              ON CONFLICT (run_id, rank) DO UPDATE SET
                host = COALESCE(NULLIF(EXCLUDED.host, ''), {RANK}.host),
                pid = COALESCE(EXCLUDED.pid, {RANK}.pid),
                info = CASE WHEN EXCLUDED.info = '{{}}'::jsonb THEN {RANK}.info ELSE EXCLUDED.info END,
                facts = CASE WHEN EXCLUDED.info = '{{}}'::jsonb THEN {RANK}.facts ELSE EXCLUDED.facts END,
                facts_key = CASE WHEN EXCLUDED.info = '{{}}'::jsonb THEN {RANK}.facts_key ELSE EXCLUDED.facts_key END,
                device = CASE WHEN EXCLUDED.info = '{{}}'::jsonb THEN {RANK}.device ELSE EXCLUDED.device END,
                collective_timeout_s = CASE WHEN EXCLUDED.info = '{{}}'::jsonb THEN {RANK}.collective_timeout_s
                                            ELSE EXCLUDED.collective_timeout_s END,
                last_step = GREATEST({RANK}.last_step, EXCLUDED.last_step),
                status = CASE WHEN {RANK}.status = '{LOST}' THEN 'running' ELSE {RANK}.status END,
                last_seen = now(),
                progress = COALESCE(EXCLUDED.progress, {RANK}.progress),
                progress_at = COALESCE(EXCLUDED.progress_at, {RANK}.progress_at)
            )"""


# The rows of these ranks (%(run)s, %(rank)s) by their ids, each looked up by the (run, rank) index: joined to
# the ranks directly, or with `rank = ANY(...)`, a young run's statistics had the planner read every
# rank of the run (a job's end is every rank ending at once, a request per rack).
_RANK_IDS = f"""ARRAY(SELECT (SELECT x.id FROM {RANK} x WHERE x.run_id = %(run)s::bigint AND x.rank = k.rank)
                      FROM unnest(%(rank)s::int[]) AS k(rank))"""

RANK_ENDS = f"""
        UPDATE {RANK} r SET status = e.status, exit_code = COALESCE(e.exit_code, r.exit_code)
        FROM unnest(%(rank)s::int[], %(status)s::text[], %(exit)s::int[]) AS e(rank, status, exit_code)
        WHERE r.id = ANY({_RANK_IDS}) AND r.rank = e.rank
        """

# A rank its node's peers saw vanish (`protocol.PeerGone`) ended then, unless it said goodbye first
# (its own rank_end always arrives before its process exits) or its pid is another process's (a restart).
RANKS_GONE = f"""
        UPDATE {RANK} r SET status = '{VANISHED}'
        FROM unnest(%(rank)s::int[], %(pid)s::bigint[]) AS g(rank, pid)
        WHERE r.id = ANY({_RANK_IDS}) AND r.rank = g.rank AND r.status IN ('running', '{LOST}')
          AND (r.pid IS NULL OR r.pid = g.pid)
        """

# Run liveness stays out of the batch transaction (every rank's batch touches this one row) and is
# skipped when nothing changes.
RUN_LIVENESS = f"""
        UPDATE {RUN} SET last_seen = now(), last_step = GREATEST(last_step, %(step)s::bigint),
          torch_version = COALESCE(NULLIF(%(torch)s::text, ''), torch_version)
        WHERE id = %(run)s::bigint AND (last_seen < now() - interval '1 second' OR last_step IS NULL
                                        OR last_step < %(step)s::bigint OR %(torch)s::text <> '')
        """
