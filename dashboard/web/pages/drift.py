"""Numeric drift between runs: the loss and the gradient norm, step by step, against a tolerance.

Two torch versions rarely agree bit for bit (a reordered reduction changes the last bit from
step 0), so "first differing step" alone cannot tell a drift of 1e-7 from one of 10%. Each run's
series comes from its lowest rank: the loss the job handed to `agent.log`, and the gradient norm
the agent computes with the fingerprints (DDP replicas hold one norm; other groups are read for
that rank). The relative difference at a step is |a - b| / max(|a|, |b|). The loss is compared at
every step (one index range per run), the norm at up to NORM_STEPS evenly spread steps (one index
probe each); the curves sent to the browser are sampled down to CURVE_BINS points.
"""

from __future__ import annotations

import math
from typing import Any, TypedDict

from dashboard.tenancy.models import Rank, Run
from dashboard.web import sql

DEFAULT_TOLERANCE = 1e-3
CURVE_BINS = 200
NORM_STEPS = 2000  # gradient norms compared per run (every step of runs up to that long)
SERIES = ("loss", "grad_norm")


def lowest_rank(run: Run) -> int | None:
    return Rank.objects.filter(run=run).order_by("rank").values_list("rank", flat=True).first()


def loss_series(run: Run, rank: int) -> dict[int, float]:
    """The loss of each step of one rank (a step logged twice keeps one of its values)."""
    rows = sql.rows(
        "SELECT step, loss FROM {step_reports} WHERE run_id = %s AND rank = %s AND loss IS NOT NULL ORDER BY step DESC",
        [run.id, rank],
    )
    return {step: loss for step, loss in rows if math.isfinite(loss)}


def grad_norm_series(run: Run, rank: int) -> dict[int, float]:
    """One norm per step, at NORM_STEPS steps at most, evenly spread (one index probe each): group
    "ddp" (replicas agree: any row of the step), else the rank's own."""
    groups = {
        g: (lo, hi)
        for g, lo, hi in sql.rows(
            'SELECT "group", min(step), max(step) FROM {grad_slots} WHERE run_id = %s GROUP BY "group"', [run.id]
        )
    }
    group = "ddp" if "ddp" in groups else min(groups, default=None)
    lo, hi = groups.get(group, (None, None))
    if lo is None:
        return {}
    rows = sql.rows(
        """
        SELECT s.step, g.norm FROM generate_series(%(lo)s::bigint, %(hi)s::bigint, %(stride)s::bigint) AS s(step),
          LATERAL (SELECT norm FROM {grad_reports} WHERE run_id = %(run)s AND step = s.step AND "group" = %(group)s
                   AND norm IS NOT NULL AND (%(group)s = 'ddp' OR %(rank)s = ANY(ranks)) LIMIT 1) g
        """,
        {
            "lo": lo,
            "hi": hi,
            "stride": max(1, -(-(hi - lo + 1) // NORM_STEPS)),
            "run": run.id,
            "group": group,
            "rank": rank,
        },
    )
    return {step: norm for step, norm in rows if math.isfinite(norm)}


class SeriesDrift(TypedDict):
    """One series of a run held against the reference run's: `compare_series`."""

    steps_compared: int
    first_bitwise_step: int | None
    first_over_tolerance: int | None
    within_tolerance_through: int | None
    max_relative: float
    max_relative_step: int | None
    relative: list[list[float]]


def relative(a: float, b: float) -> float:
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale > 0 else 0.0


def compare_series(base: dict[int, float], other: dict[int, float], tolerance: float) -> SeriesDrift:
    """First bitwise step, first step past `tolerance`, the largest drift and the curve of it."""
    steps = sorted(set(base) & set(other))
    rel = [(s, relative(base[s], other[s])) for s in steps]
    bitwise = next((s for s in steps if base[s] != other[s]), None)
    over = next((s for s, r in rel if r > tolerance), None)
    worst = max(rel, key=lambda item: item[1], default=(None, 0.0))
    return {
        "steps_compared": len(steps),
        "first_bitwise_step": bitwise,
        "first_over_tolerance": over,
        "within_tolerance_through": (steps[-1] if over is None else _before(steps, over)) if steps else None,
        "max_relative": float(f"{worst[1]:.3g}"),
        "max_relative_step": worst[0],
        "relative": sample(rel),
    }


def _before(steps: list[int], step: int) -> int | None:
    earlier = [s for s in steps if s < step]
    return earlier[-1] if earlier else None


def sample(points: list[tuple[int, float]], bins: int = CURVE_BINS) -> list[list[float]]:
    """At most `bins` points, evenly spread, the last one kept."""
    if len(points) <= bins:
        return [[s, v] for s, v in points]
    width = -(-len(points) // bins)
    picked = points[::width]
    if picked[-1] != points[-1]:
        picked.append(points[-1])
    return [[s, v] for s, v in picked]


def drift(runs: list[Run], tolerance: float) -> dict[str, Any]:
    """Each run's curves and, for every run after the first, its drift from the first."""
    series = {}
    for run in runs:
        rank = lowest_rank(run)
        series[run.key] = (
            {"loss": loss_series(run, rank), "grad_norm": grad_norm_series(run, rank)}
            if rank is not None
            else {"loss": {}, "grad_norm": {}}
        )
    base = series[runs[0].key]
    return {
        "tolerance": tolerance,
        "series": {
            key: {name: sample(sorted(values[name].items())) for name in SERIES} for key, values in series.items()
        },
        "vs": [
            {
                "run": other.key,
                **{name: compare_series(base[name], series[other.key][name], tolerance) for name in SERIES},
            }
            for other in runs[1:]
        ],
    }


def parse_tolerance(text: str | None) -> float:
    """`?tol=` as a number >= 0 (0: bitwise); blank means the default. Raises ValueError otherwise."""
    if text is None or not text.strip():
        return DEFAULT_TOLERANCE
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(text)
    return value
