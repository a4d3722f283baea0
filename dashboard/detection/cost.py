"""A run's compile bill: the GPU time compilation took from the job, per frame and per cause.

The ranks of a data-parallel job meet at a collective every step (DDP's all-reduce in backward), so
a step in which any rank compiled costs every rank the slowest rank's compile time: the step costs
`world_size x` that ("assumed"). Where the ranks' progress samples saw them wait in a collective of
that step long enough for the agent to report the wait as it went (every flush once a phase lasts
protocol.STUCK_S), the measured waits replace the assumption for those ranks ("measured"). Compiles outside
the training steps (no step known) are a unit each per compile slot (frame, n-th compile).

A unit's cost goes to the slowest rank's compiles in proportion to their times, each under its
cause: a failed compile; a cache miss another rank or an earlier run shows was avoidable; a
recompile, by what its guard saw change (`remedies.reason_line`); a first compile. What the slowest
rank took beyond the median of the ranks compiling the same slot, when it is a straggler by
`compile_straggler`'s measure, is filed as `compile_straggler`. Warm-cache savings: what the unit
would have cost had each cache hit taken the mean time of the same frame's misses.

`compute` is pure (plain data in, plain data out); `bill_of` reads what it needs.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from statistics import median
from typing import NamedTuple

from django.db.models import Count, FloatField, Min, Q
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.utils import timezone

from agents import protocol
from agents.normalize import frame_label
from dashboard.detection import remedies
from dashboard.detection.rules import outcome_of
from dashboard.detection.rules.compile_straggler import straggles
from dashboard.evidence import reads
from dashboard.tenancy.models import Rank, Run

CAUSES = ("first_compile", "recompile", "avoidable_miss", "compile_straggler", "failed_compile")
LOOKBACK = timedelta(days=30)  # earlier runs whose cache entries count
LINE_RANKS = 64  # ranks listed per line (all of them for the top line)


class Compile(NamedTuple):
    """One rank's compile of one frame, as the bill needs it (a tuple: a big run has tens of thousands)."""

    rank: int
    frame: str
    index: int
    step: int | None
    status: str
    seconds: float
    reason: str | None = None  # the guard failure of a recompile
    fail_type: str | None = None
    outcome: str | None = None  # "hit" | "miss" | None: the Inductor (else AOTAutograd) cache outcome
    key: str = ""  # that cache's key
    end: float = 0.0  # unix seconds when it finished (the agent's clock)


@dataclass
class Line:
    frame: str
    cause: str
    reason: str
    gpu_seconds: float = 0.0
    compiles: int = 0
    compile_seconds: float = 0.0
    ranks: set = field(default_factory=set)
    measured: float = 0.0  # of gpu_seconds, from measured waits


# --- the pure part -----------------------------------------------------------------------


def avoidable(compiles: list[Compile], had_before: set[str]) -> set[int]:
    """Indices of misses whose entry existed elsewhere: an earlier run had the key, or another rank of
    this run hit it with a lookup that began before this miss ended (a hit that began later may have
    loaded what this very miss wrote into a shared cache)."""
    earliest: dict[str, dict[int, float]] = defaultdict(dict)  # key -> rank -> its first hit's start
    for c in compiles:
        if c.outcome == "hit" and c.key:
            per_rank = earliest[c.key]
            start = c.end - c.seconds
            if start < per_rank.get(c.rank, math.inf):
                per_rank[c.rank] = start
    # the earliest hit of a rank other than r is the first of these two whose rank is not r
    first_two = {key: heapq.nsmallest(2, ((t, r) for r, t in per_rank.items())) for key, per_rank in earliest.items()}
    out = set()
    for i, c in enumerate(compiles):
        if c.outcome != "miss" or not c.key:
            continue
        other = next((t for t, r in first_two.get(c.key, ()) if r != c.rank), math.inf)
        if c.key in had_before or other < c.end:
            out.add(i)
    return out


def cause_of(c: Compile, is_avoidable: bool) -> str:
    if c.status == "failed":
        return "failed_compile"
    if is_avoidable:
        return "avoidable_miss"
    return "recompile" if c.index > 0 else "first_compile"


def reason_of(c: Compile, cause: str, breaks: dict[str, int]) -> str:
    if cause == "recompile":
        return remedies.reason_line(c.reason)
    if cause == "failed_compile":
        return c.fail_type or "failed"
    if cause == "first_compile" and breaks.get(c.frame):
        return f"{breaks[c.frame]} graph break{'s' if breaks[c.frame] != 1 else ''} in this frame"
    return ""


def straggler_excess(seconds: float, others: list[float]) -> float:
    """How much of `seconds` is straggling behind the slot's median (`compile_straggler`'s measure)."""
    if len(others) < 2:
        return 0.0
    mid = median(others)
    return seconds - mid if straggles(seconds, mid) else 0.0


def unit_of(c: Compile) -> tuple:
    return ("step", c.step) if c.step is not None else ("slot", c.frame, c.index)


def compute(
    world: int,
    compiles: list[Compile],
    waits: dict[tuple[int, int], float] | None = None,
    *,
    wall_s: float = 0.0,
    price: float | None = None,
    had_before: set[str] | frozenset = frozenset(),
    miss_s_elsewhere: dict[str, float] | None = None,
    breaks: dict[str, int] | None = None,
) -> dict:
    """The bill of `compiles` in a job of `world` ranks. `waits`: (rank, step) -> seconds a rank was
    seen waiting in a collective; `had_before`: cache keys an earlier run had; `miss_s_elsewhere`:
    per frame, the mean miss time in earlier runs (for savings where this run has only hits);
    `breaks`: graph breaks per frame."""
    waits, breaks, miss_s_elsewhere = waits or {}, breaks or {}, miss_s_elsewhere or {}
    world = max(world, max((c.rank for c in compiles), default=-1) + 1, 1)
    skipped = avoidable(compiles, set(had_before))
    by_step: dict[int, dict[int, float]] = defaultdict(dict)
    for (rank, step), seconds in waits.items():
        if seconds >= protocol.STUCK_S and 0 <= rank < world:
            by_step[step][rank] = seconds
    units: dict[tuple, list[int]] = defaultdict(list)
    for i, c in enumerate(compiles):
        units[unit_of(c)].append(i)
    miss_means = _miss_means(compiles, miss_s_elsewhere)
    lines: dict[tuple, Line] = {}
    owners = _owners(compiles, skipped, breaks, lines)
    basis = {"assumed_units": 0, "measured_units": 0, "assumed_s": 0.0, "measured_s": 0.0}
    saved: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for unit, members in units.items():
        sums = _unit_sums(members, compiles, miss_means)
        _bill_unit(world, unit, members, compiles, owners, sums, by_step, lines, basis)
        _save_unit(world, sums, saved)
    return {
        **_summary(world, lines, basis, saved, wall_s, price),
        "compile_seconds": round(sum(c.seconds for c in compiles), 6),
    }


def _owners(compiles: list[Compile], skipped: set[int], breaks: dict[str, int], lines: dict) -> list[Line]:
    """Each compile's line (frame, cause, reason), counted there. The cause and reason are worked out
    once per kind of compile: a 1,024-rank job repeats each kind on every rank."""
    kinds: dict[tuple, Line] = {}
    owners = []
    for i, c in enumerate(compiles):
        kind = (c.frame, c.status, c.index > 0, i in skipped, c.reason, c.fail_type)
        line = kinds.get(kind)
        if line is None:
            cause = cause_of(c, i in skipped)
            line = kinds[kind] = _line(lines, c.frame, cause, reason_of(c, cause, breaks))
        line.compiles += 1
        line.compile_seconds += c.seconds
        line.ranks.add(c.rank)
        owners.append(line)
    return owners


def _line(lines: dict, frame: str, cause: str, reason: str) -> Line:
    key = (frame, cause, reason)
    if key not in lines:
        lines[key] = Line(frame, cause, reason)
    return lines[key]


class UnitSums(NamedTuple):
    """One pass over a unit's compiles: per rank its compile seconds, and what they would have been with
    every hit of a frame with known misses as slow as that frame's mean miss ("cold"); per slot (frame,
    n-th compile) its ranks' times; per frame its hits counted in `cold`."""

    actual: dict[int, float]
    cold: dict[int, float]
    slot_times: dict[tuple, list[float]]
    hits: dict[str, int]


def _unit_sums(members: list[int], compiles: list[Compile], miss_means: dict[str, float]) -> UnitSums:
    sums = UnitSums(defaultdict(float), defaultdict(float), defaultdict(list), defaultdict(int))
    for i in members:
        c = compiles[i]
        sums.actual[c.rank] += c.seconds
        sums.slot_times[(c.frame, c.index)].append(c.seconds)
        mean = miss_means.get(c.frame) if c.outcome == "hit" else None
        if mean is not None:
            sums.cold[c.rank] += max(mean, c.seconds)
            sums.hits[c.frame] += 1
        else:
            sums.cold[c.rank] += c.seconds
    return sums


def _bill_unit(
    world: int,
    unit: tuple,
    members: list[int],
    compiles: list[Compile],
    owners: list[Line],
    sums: UnitSums,
    waits: dict,
    lines: dict,
    basis: dict,
) -> None:
    per_rank = sums.actual
    slowest = min(per_rank, key=lambda r: (-per_rank[r], r))
    top = per_rank[slowest]
    if top <= 0:
        return
    seen = waits.get(unit[1], {}) if unit[0] == "step" else {}
    if seen:  # seen ranks: their compiles and measured waits; the others wait for the slowest (assumed)
        cost = sum(per_rank.get(r, 0.0) + w for r, w in seen.items()) + (world - len(seen)) * top
        basis["measured_units"] += 1
        basis["measured_s"] += cost
    else:
        cost = world * top
        basis["assumed_units"] += 1
        basis["assumed_s"] += cost
    for i in members:
        c = compiles[i]
        if c.rank != slowest or c.seconds <= 0:
            continue
        share = cost * c.seconds / top
        excess = straggler_excess(c.seconds, sums.slot_times[(c.frame, c.index)])
        parts = [(owners[i], share * (1 - excess / c.seconds))]
        if excess:
            slow = _line(lines, c.frame, "compile_straggler", f"rank {c.rank} slower than the median")
            slow.ranks.add(c.rank)
            parts.append((slow, share * excess / c.seconds))
        for line, amount in parts:
            line.gpu_seconds += amount
            if seen:
                line.measured += amount


def _miss_means(compiles: list[Compile], elsewhere: dict[str, float]) -> dict[str, float]:
    """Per frame, the mean time of its cache misses here, else in earlier runs."""
    sums: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for c in compiles:
        if c.outcome == "miss" and c.status != "failed":
            sums[c.frame][0] += c.seconds
            sums[c.frame][1] += 1
    return {**elsewhere, **{f: s / n for f, (s, n) in sums.items() if n}}


def _save_unit(world: int, sums: UnitSums, saved: dict) -> None:
    """What the unit would have cost (assumed) had each hit been a miss of its frame, minus what it cost."""
    if not sums.hits:
        return
    gained = world * (max(sums.cold.values()) - max(sums.actual.values()))
    if gained <= 0:
        return
    total = sum(sums.hits.values())
    for frame, n in sums.hits.items():
        saved[frame][0] += gained * n / total
        saved[frame][1] += n


def _summary(
    world: int, lines: dict[tuple, Line], basis: dict, saved: dict, wall_s: float, price: float | None
) -> dict:
    total = sum(line.gpu_seconds for line in lines.values())
    as_json = {id(line): _line_json(line) for line in lines.values()}  # a frame's lines and the ranked ones
    frames: dict[str, dict] = {}
    for line in sorted(lines.values(), key=lambda x: -x.gpu_seconds):
        row = frames.setdefault(
            line.frame,
            {
                "frame": line.frame,
                "label": frame_label(line.frame),
                "gpu_seconds": 0.0,
                "compiles": 0,
                "ranks": set(),
                "lines": [],
            },
        )
        row["gpu_seconds"] += line.gpu_seconds
        row["compiles"] += line.compiles if line.cause != "compile_straggler" else 0
        row["ranks"] |= line.ranks
        row["lines"].append(as_json[id(line)])
    frame_rows = sorted(frames.values(), key=lambda f: (-f["gpu_seconds"], f["frame"]))
    for row in frame_rows:
        row["gpu_seconds"] = round(row["gpu_seconds"], 3)
        row["rank_count"] = len(row["ranks"])
        row["ranks"] = sorted(row["ranks"])[:LINE_RANKS]
    ranked = sorted((x for x in lines.values() if x.gpu_seconds > 0), key=lambda x: (-x.gpu_seconds, x.frame, x.cause))
    by_cause = {cause: 0.0 for cause in CAUSES}
    for line in lines.values():
        by_cause[line.cause] += line.gpu_seconds
    gpu_wall = world * wall_s
    savings = sum(s for s, _ in saved.values())
    return {
        "world_size": world,
        "wall_s": round(wall_s, 3),
        "gpu_seconds": round(total, 3),
        "gpu_hours": round(total / 3600, 6),
        "share": round(total / gpu_wall, 6) if gpu_wall > 0 else None,
        "price_per_gpu_hour": price,
        "money": round(total / 3600 * price, 2) if price is not None else None,
        "basis": {
            "assumed_units": basis["assumed_units"],
            "measured_units": basis["measured_units"],
            "assumed_s": round(basis["assumed_s"], 3),
            "measured_s": round(basis["measured_s"], 3),
        },
        "causes": {cause: round(s, 3) for cause, s in by_cause.items()},
        "frames": frame_rows,
        "lines": [as_json[id(x)] for x in ranked],
        "top": {**as_json[id(ranked[0])], "ranks": sorted(ranked[0].ranks)} if ranked else None,
        "savings": {
            "gpu_seconds": round(savings, 3),
            "hits": sum(n for _, n in saved.values()),
            "money": round(savings / 3600 * price, 2) if price is not None else None,
            "frames": [
                {"frame": f, "label": frame_label(f), "gpu_seconds": round(s, 3), "hits": n}
                for f, (s, n) in sorted(saved.items(), key=lambda kv: -kv[1][0])
            ],
        },
    }


def _line_json(line: Line) -> dict:
    return {
        "frame": line.frame,
        "label": frame_label(line.frame),
        "cause": line.cause,
        "reason": line.reason,
        "gpu_seconds": round(line.gpu_seconds, 3),
        "compiles": line.compiles,
        "compile_seconds": round(line.compile_seconds, 3),
        "rank_count": len(line.ranks),
        "ranks": sorted(line.ranks)[:LINE_RANKS],
        "basis": "measured" if line.measured and line.measured >= line.gpu_seconds / 2 else "assumed",
        "remedy": remedies.remedy(line.cause, line.reason, line.frame),
    }


# --- what it reads -----------------------------------------------------------------------


def compile_rows(run_id: int) -> list[Compile]:
    """The run's compiles, with their cache outcome and key."""
    facts = reads.compile_facts(run_id)
    outcomes = {raw: outcome_of(raw) for raw in {f[8] for f in facts}}  # a handful of distinct strings
    return [
        Compile(rank, frame, index, step, status, seconds, reason, fail, outcomes[out], key, end)
        for rank, frame, index, step, status, seconds, reason, fail, out, key, end in facts
    ]


def collective_waits(run_id: int, steps: list[int]) -> dict[tuple[int, int], float]:
    """(rank, step) -> the longest wait in a collective its progress samples saw in that step."""
    return reads.collective_waits(run_id, steps) if steps else {}


def earlier_runs(run: Run):
    return Run.objects.filter(
        project_id=run.project_id, started_at__lt=run.started_at, started_at__gte=run.started_at - LOOKBACK
    ).values("id")


def keys_had_before(run: Run, keys: set[str]) -> set[str]:
    """Of `keys`, those an earlier run of the project compiled or loaded (its cache held the entry)."""
    if not keys:
        return set()
    return reads.keys_compiled(earlier_runs(run), keys)


def misses_before(run: Run, frames: set[str]) -> dict[str, float]:
    """Per frame, the mean compile time of its cache misses in earlier runs of the project."""
    if not frames:
        return {}
    return reads.miss_seconds(earlier_runs(run), frames)


def wall_seconds(run: Run, earliest: float | None = None, now: datetime | None = None) -> float:
    """How long the run has gone: once every rank ended, from its first rank_start (or `earliest`, its
    first compile's start: a rank that starts again keeps only its last rank_start) to its last
    rank_end by the agents' clocks; until then from the server's first sight of it until now."""
    now = now or timezone.now()
    ranks = Rank.objects.filter(run=run).aggregate(
        ended=Count("id", filter=~Q(status="running")), first=Min(Cast(KT("info__ts"), FloatField()))
    )
    first = min(x for x in (ranks["first"], earliest) if x) if ranks["first"] or earliest else None
    if ranks["ended"] >= run.world_size and first:
        last = reads.last_end_ts(run.id)
        if last and last > first:
            return last - first
    return max(0.0, (now - run.started_at).total_seconds())


def bill_of(run: Run, now: datetime | None = None) -> dict:
    """The run's bill (`compute`) from its stored compile events and progress samples."""
    compiles = compile_rows(run.id)
    steps = sorted({c.step for c in compiles if c.step is not None})
    misses = {c.key for c in compiles if c.outcome == "miss" and c.key}
    hit_frames = {c.frame for c in compiles if c.outcome == "hit"}
    price = run.project.gpu_hour_price
    earliest = min((c.end - c.seconds for c in compiles), default=None)
    bill = compute(
        run.world_size,
        compiles,
        collective_waits(run.id, steps),
        wall_s=wall_seconds(run, earliest, now),
        price=float(price) if price is not None else None,
        had_before=keys_had_before(run, misses),
        miss_s_elsewhere=misses_before(run, hit_frames - {c.frame for c in compiles if c.outcome == "miss"}),
        breaks=reads.breaks_by_frame(run.id),
    )
    return {"run": run.key, "project": run.project.name, **bill}
