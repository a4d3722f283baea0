"""Run timeline and agreement heatmap, aggregated in PostgreSQL.

The browser never receives per-rank events: compile spans are merged per (row, time bin,
cache outcome), where a row is one rank up to MAX_ROWS ranks and a contiguous block of ranks
beyond; markers are counted per (row, time bin); the heatmap holds only the (step bin, rank)
cells where a rank dissented. The payload is bounded by rows x bins whatever the run size
(push aggregates, never raw per-rank events: docs/design.md, Pages).
"""

from __future__ import annotations

from typing import Any

from dashboard.tenancy.models import Run
from dashboard.web import sql

TIME_BINS = 240
MAX_ROWS = 128  # timeline rows; more ranks are merged into contiguous blocks
STEP_BINS = 200

# One cache outcome per compile, worst first: a failure beats a miss beats a bypass beats a hit.
OUTCOME_SQL = """
CASE WHEN status <> 'ok' THEN 'failed'
     WHEN cache::text LIKE '%%miss%%' THEN 'miss'
     WHEN cache::text LIKE '%%bypass%%' THEN 'bypass'
     WHEN cache::text LIKE '%%hit%%' THEN 'hit'
     ELSE 'none' END
"""


def time_bounds(run: Run) -> tuple[float, float] | None:
    """Earliest compile start and latest compile end / graph break, as unix seconds."""
    row = sql.rows(
        """
        SELECT min(t0), max(t1) FROM (
          SELECT min(extract(epoch FROM ts)::float8 - coalesce(compile_time, 0)) t0, max(extract(epoch FROM ts)::float8) t1
          FROM {compile_events} WHERE run_id = %s
          UNION ALL
          SELECT min(extract(epoch FROM ts)::float8), max(extract(epoch FROM ts)::float8) FROM {graph_breaks} WHERE run_id = %s
        ) b
        """,
        [run.id, run.id],
    )[0]
    if row[0] is None:
        return None
    return float(row[0]), max(float(row[1]), float(row[0]) + 1e-3)


def rank_group(world: int, rows: int = MAX_ROWS) -> int:
    """Ranks per timeline row: 1 up to MAX_ROWS ranks, then contiguous blocks (1024 ranks -> 8 per row)."""
    return max(1, -(-world // rows))


def compile_spans(run: Run, t0: float, width: float, group: int) -> tuple[list[list[Any]], list[list[Any]]]:
    """One scan of the run's compiles, merged per (row of ranks, time bin, cache outcome).

    Returns spans [row, start_s, end_s, outcome, compiles, recompiles] and recompile markers
    [row, time_s, count], seconds from t0; the worst outcome colours a span.
    """
    rows = sql.rows(
        f"""
        SELECT rank / %(g)s, outcome, min(t_start) - %(t0)s, max(t_end) - %(t0)s, count(*),
               count(*) FILTER (WHERE index > 0), avg(t_end) FILTER (WHERE index > 0) - %(t0)s
        FROM (
          SELECT rank, index, {OUTCOME_SQL} AS outcome,
                 extract(epoch FROM ts)::float8 - coalesce(compile_time, 0) AS t_start, extract(epoch FROM ts)::float8 AS t_end
          FROM {{compile_events}} WHERE run_id = %(run)s
        ) e
        GROUP BY 1, floor((t_start - %(t0)s) / %(w)s), outcome
        ORDER BY 1
        """,
        {"run": run.id, "t0": t0, "w": width, "g": group},
    )
    spans = [[row, round(s, 3), round(e, 3), outcome, n, rec] for row, outcome, s, e, n, rec, _ in rows]
    recompiles = [[row, round(t, 3), rec] for row, _, _, _, _, rec, t in rows if rec]
    return spans, recompiles


def graph_breaks(run: Run, t0: float, width: float, group: int) -> list[list[Any]]:
    """[row, time_s, count] per (row of ranks, time bin)."""
    rows = sql.rows(
        """
        SELECT rank / %(g)s, avg(extract(epoch FROM ts)::float8) - %(t0)s, count(*) FROM {graph_breaks}
        WHERE run_id = %(run)s
        GROUP BY 1, floor((extract(epoch FROM ts)::float8 - %(t0)s) / %(w)s) ORDER BY 1
        """,
        {"run": run.id, "t0": t0, "w": width, "g": group},
    )
    return [[row, round(t, 3), n] for row, t, n in rows]


def heatmap(run: Run, bins: int = STEP_BINS) -> dict[str, Any]:
    """Ranks x step bins: how many settled grad slots each rank dissented on (only non-zero cells)."""
    lo, hi = sql.rows("SELECT min(step), max(step) FROM {grad_slots} WHERE run_id = %s", [run.id])[0]
    if lo is None:
        return {"step_lo": None, "step_width": 1, "bins": 0, "slots": [], "cells": []}
    width = max(1, -(-(hi - lo + 1) // bins))
    n_bins = (hi - lo) // width + 1
    slots = sql.rows(
        """
        SELECT (step - %(lo)s) / %(w)s, count(*), count(*) FILTER (WHERE settled_at IS NULL OR reported > settled_n)
        FROM {grad_slots} WHERE run_id = %(run)s GROUP BY 1 ORDER BY 1
        """,
        {"run": run.id, "lo": lo, "w": width},
    )
    cells = sql.rows(
        """
        SELECT (s.step - %(lo)s) / %(w)s, d.rank, count(*)
        FROM {grad_slots} s, unnest(s.dissenters) AS d(rank)
        WHERE s.run_id = %(run)s AND cardinality(s.dissenters) > 0
        GROUP BY 1, 2 ORDER BY 1, 2
        """,
        {"run": run.id, "lo": lo, "w": width},
    )
    return {
        "step_lo": lo,
        "step_width": width,
        "bins": n_bins,
        "slots": [[b, n, pending] for b, n, pending in slots],
        "cells": [[b, r, n] for b, r, n in cells],
    }


def timeline(run: Run, bins: int = TIME_BINS) -> dict[str, Any]:
    """Everything the run page draws, bounded by rows x bins whatever the ranks and steps."""
    bounds = time_bounds(run)
    group = rank_group(run.world_size)
    body: dict[str, Any] = {
        "run": run.key,
        "world_size": run.world_size,
        "rank_group": group,
        "rows": -(-run.world_size // group),
        "heatmap": heatmap(run),
    }
    if bounds is None:
        body.update(t0=None, duration=0, spans=[], markers={"recompiles": [], "graph_breaks": []})
        return body
    t0, t1 = bounds
    width = (t1 - t0) / bins
    spans, recompiles = compile_spans(run, t0, width, group)
    body.update(
        t0=t0,
        duration=round(t1 - t0, 3),
        bin_s=width,
        spans=spans,
        markers={"recompiles": recompiles, "graph_breaks": graph_breaks(run, t0, width, group)},
    )
    return body
