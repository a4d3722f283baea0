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

import gc
import heapq
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from statistics import median
from typing import Any, Literal, NamedTuple, TypedDict, TypeVar

from django.db.models import Count, FloatField, Min, Q, QuerySet
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
# Frames, lines, a frame's lines and saving frames a bill lists, costliest first; the rest only counted and
# summed (`*_left_out`): a run of 40,000 frames had a bill of 17.5 MiB, kept, and read by every reader.
BILL_ROWS = 100


class Compile(NamedTuple):
    """One rank's compile of one frame, as the bill needs it (a tuple: a big run has tens of thousands)."""

    rank: int
    frame: str
    index: int  # type: ignore[assignment]  # the compile's index, shadowing tuple.index (never called)
    step: int | None
    status: str
    seconds: float
    reason: str | None = None  # the guard failure of a recompile
    fail_type: str | None = None
    outcome: str | None = None  # "hit" | "miss" | None: the Inductor (else AOTAutograd) cache outcome
    key: str = ""  # that cache's key
    end: float = 0.0  # unix seconds when it finished (the agent's clock)


T = TypeVar("T")
Unit = tuple[Literal["step"], int] | tuple[Literal["slot"], str, int]  # what the ranks wait on together
Slot = tuple[str, int]  # (frame, n-th compile)
LineKey = tuple[str, str, str]  # (frame, cause, reason)


@dataclass
class Line:
    frame: str
    cause: str
    reason: str
    gpu_seconds: float = 0.0
    compiles: int = 0
    compile_seconds: float = 0.0
    ranks: set[int] = field(default_factory=set)
    measured: float = 0.0  # of gpu_seconds, from measured waits


# --- the pure part -----------------------------------------------------------------------


def avoidable(compiles: list[Compile], had_before: set[str]) -> set[int]:
    """Indices of misses whose entry existed elsewhere: an earlier run had the key, or another rank of
    this run hit it with a lookup that began before this miss ended (a hit that began later may have
    loaded what this very miss wrote into a shared cache)."""
    earliest: dict[str, dict[int, float]] = defaultdict(dict)  # key -> rank -> its first hit's start
    misses = []
    for i, c in enumerate(compiles):
        if not c.key:
            continue
        if c.outcome == "hit":
            per_rank = earliest[c.key]
            start = c.end - c.seconds
            if start < per_rank.get(c.rank, math.inf):
                per_rank[c.rank] = start
        elif c.outcome == "miss":
            misses.append(i)
    # the earliest hit of a rank other than r is the first of these two whose rank is not r
    first_two = {key: heapq.nsmallest(2, ((t, r) for r, t in per_rank.items())) for key, per_rank in earliest.items()}
    out = set()
    for i in misses:
        c = compiles[i]
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


def reason_of(c: Compile, cause: str, breaks: dict[str, int], in_torch: AbstractSet[str] = frozenset()) -> str:
    if cause == "recompile":
        return remedies.reason_line(c.reason)
    if cause == "failed_compile":
        return c.fail_type or "failed"
    if cause == "first_compile" and breaks.get(c.frame):
        where = remedies.INSIDE_TORCH if c.frame in in_torch else "in this frame"
        return f"{breaks[c.frame]} graph break{'s' if breaks[c.frame] != 1 else ''} {where}"
    return ""


def straggler_excess(seconds: float, others: list[float]) -> float:
    """How much of `seconds` is straggling behind the slot's median (`compile_straggler`'s measure)."""
    if len(others) < 2:
        return 0.0
    mid = median(others)
    return seconds - mid if straggles(seconds, mid) else 0.0


def unit_of(c: Compile) -> Unit:
    return ("step", c.step) if c.step is not None else ("slot", c.frame, c.index)


def compute(
    world: int,
    compiles: list[Compile],
    waits: dict[int, dict[int, float]] | None = None,
    *,
    wall_s: float = 0.0,
    price: float | None = None,
    had_before: set[str] | frozenset[str] = frozenset(),
    miss_s_elsewhere: dict[str, float] | None = None,
    breaks: dict[str, int] | None = None,
    breaks_in_torch: AbstractSet[str] = frozenset(),
) -> dict[str, Any]:
    """The bill of `compiles` in a job of `world` ranks. `waits`: step -> rank -> seconds the rank was
    seen waiting in a collective; `had_before`: cache keys an earlier run had; `miss_s_elsewhere`:
    per frame, the mean miss time in earlier runs (for savings where this run has only hits);
    `breaks`: graph breaks per frame (its distinct break sites, as the frame page lists them: every
    rank breaks alike, and a sum over ranks counted one break once per rank); `breaks_in_torch`: the frames whose every break is inside torch's
    own code (`remedies.inside_torch`: no fix in the user's code, the remedy says what the user can do)."""
    waits, breaks, miss_s_elsewhere = waits or {}, breaks or {}, miss_s_elsewhere or {}
    world = max(world, max((c.rank for c in compiles), default=-1) + 1, 1)
    by_step = {
        step: seen
        for step, per_rank in waits.items()
        if (seen := {r: s for r, s in per_rank.items() if s >= protocol.STUCK_S and 0 <= r < world})
    }
    miss_means = _miss_means(compiles, miss_s_elsewhere)
    lines: dict[LineKey, Line] = {}
    owners, units = _sort(compiles, avoidable(compiles, set(had_before)), (breaks, breaks_in_torch), lines)
    basis = {"assumed_units": 0, "measured_units": 0, "assumed_s": 0.0, "measured_s": 0.0}
    saved: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for unit, slots in units.items():
        seen = by_step.get(unit[1], {}) if unit[0] == "step" else {}
        sums = _unit_sums(slots, compiles, miss_means)
        cost = _bill_unit(world, seen, slots, compiles, owners, sums, lines)
        _count_basis(basis, cost, measured=bool(seen))
        _save_unit(world, sums, saved)
    return {
        **_summary(world, lines, basis, saved, wall_s, price),
        "compile_seconds": round(sum(c.seconds for c in compiles), 6),
    }


def _sort(
    compiles: list[Compile],
    skipped: set[int],
    breaks: tuple[dict[str, int], AbstractSet[str]],
    lines: dict[LineKey, Line],
) -> tuple[list[Line], dict[Unit, dict[Slot, list[int]]]]:
    """One pass: each compile's line (frame, cause, reason), counted there, and the compiles by unit
    and slot (frame, n-th compile). The cause and reason are worked out once per kind of compile: a
    1,024-rank job repeats each kind on every rank."""
    kinds: dict[tuple[str, str, bool, bool, str | None, str | None], Line] = {}
    owners = []
    units: dict[Unit, dict[Slot, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, c in enumerate(compiles):
        kind = (c.frame, c.status, c.index > 0, i in skipped, c.reason, c.fail_type)
        line = kinds.get(kind)
        if line is None:
            cause = cause_of(c, i in skipped)
            line = kinds[kind] = _line(lines, c.frame, cause, reason_of(c, cause, *breaks))
        line.compiles += 1
        line.compile_seconds += c.seconds
        line.ranks.add(c.rank)
        owners.append(line)
        units[unit_of(c)][(c.frame, c.index)].append(i)
    return owners, units


def _line(lines: dict[LineKey, Line], frame: str, cause: str, reason: str) -> Line:
    key = (frame, cause, reason)
    if key not in lines:
        lines[key] = Line(frame, cause, reason)
    return lines[key]


class UnitSums(NamedTuple):
    """One pass over a unit's compiles: per rank its compile seconds, and what they would have been with
    every hit of a frame with known misses as slow as that frame's mean miss ("cold"); per frame its
    hits counted in `cold`."""

    actual: dict[int, float]
    cold: dict[int, float]
    hits: dict[str, int]


def _unit_sums(slots: dict[Slot, list[int]], compiles: list[Compile], miss_means: dict[str, float]) -> UnitSums:
    sums = UnitSums(defaultdict(float), defaultdict(float), defaultdict(int))
    actual, cold = sums.actual, sums.cold
    for (frame, _), members in slots.items():
        mean = miss_means.get(frame)
        for i in members:
            c = compiles[i]
            actual[c.rank] += c.seconds
            if mean is not None and c.outcome == "hit":
                cold[c.rank] += max(mean, c.seconds)
                sums.hits[frame] += 1
            else:
                cold[c.rank] += c.seconds
    return sums


def _bill_unit(
    world: int,
    seen: dict[int, float],
    slots: dict[Slot, list[int]],
    compiles: list[Compile],
    owners: list[Line],
    sums: UnitSums,
    lines: dict[LineKey, Line],
) -> float:
    """The unit's cost, charged to the slowest rank's compiles. `seen`: the ranks whose waits in the
    unit's collective were measured; the others wait for the slowest (assumed)."""
    per_rank = sums.actual
    slowest = min(per_rank, key=lambda r: (-per_rank[r], r))
    top = per_rank[slowest]
    if top <= 0:
        return 0.0
    cost = sum(per_rank.get(r, 0.0) + w for r, w in seen.items()) + (world - len(seen)) * top
    for members in slots.values():
        for i in members:
            c = compiles[i]
            if c.rank == slowest and c.seconds > 0:
                times = [compiles[j].seconds for j in members]
                _charge(c, owners[i], cost * c.seconds / top, times, lines, measured=bool(seen))
    return cost


def _charge(
    c: Compile, owner: Line, share: float, slot_times: list[float], lines: dict[LineKey, Line], *, measured: bool
) -> None:
    """`share` of a unit's cost onto compile `c`'s line; what it straggled behind its slot's median
    onto the frame's `compile_straggler` line."""
    excess = straggler_excess(c.seconds, slot_times)
    parts = [(owner, share * (1 - excess / c.seconds))]
    if excess:
        slow = _line(lines, c.frame, "compile_straggler", f"rank {c.rank} slower than the median")
        slow.ranks.add(c.rank)
        parts.append((slow, share * excess / c.seconds))
    for line, amount in parts:
        line.gpu_seconds += amount
        if measured:
            line.measured += amount


def _count_basis(basis: dict[str, float], cost: float, *, measured: bool) -> None:
    if cost:
        kind = "measured" if measured else "assumed"
        basis[f"{kind}_units"] += 1
        basis[f"{kind}_s"] += cost


def _miss_means(compiles: list[Compile], elsewhere: dict[str, float]) -> dict[str, float]:
    """Per frame, the mean time of its cache misses here, else in earlier runs."""
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for c in compiles:
        if c.outcome == "miss" and c.status != "failed":
            sums[c.frame][0] += c.seconds
            sums[c.frame][1] += 1
    return {**elsewhere, **{f: s / n for f, (s, n) in sums.items() if n}}


def _save_unit(world: int, sums: UnitSums, saved: dict[str, list[float]]) -> None:
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
    world: int,
    lines: dict[LineKey, Line],
    basis: dict[str, float],
    saved: dict[str, list[float]],
    wall_s: float,
    price: float | None,
) -> dict[str, Any]:
    total = sum(line.gpu_seconds for line in lines.values())
    frames: dict[str, dict[str, Any]] = {}
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
        row["lines"].append(line)
    frame_rows, frames_left_out = _costliest(
        sorted(frames.values(), key=lambda f: (-f["gpu_seconds"], f["frame"])), lambda f: f["gpu_seconds"]
    )
    for row in frame_rows:
        row["gpu_seconds"] = round(row["gpu_seconds"], 3)
        row["rank_count"] = len(row["ranks"])
        row["ranks"] = sorted(row["ranks"])[:LINE_RANKS]
        kept, row["lines_left_out"] = _costliest(row["lines"], lambda x: x.gpu_seconds)
        row["lines"] = [_line_json(x) for x in kept]
    ranked, lines_left_out = _costliest(
        sorted((x for x in lines.values() if x.gpu_seconds > 0), key=lambda x: (-x.gpu_seconds, x.frame, x.cause)),
        lambda x: x.gpu_seconds,
    )
    saving, savings_left_out = _costliest(sorted(saved.items(), key=lambda kv: -kv[1][0]), lambda kv: kv[1][0])
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
        "frames_left_out": frames_left_out,
        "lines": [_line_json(x) for x in ranked],
        "lines_left_out": lines_left_out,
        "top": {**_line_json(ranked[0]), "ranks": sorted(ranked[0].ranks)} if ranked else None,
        "savings": {
            "gpu_seconds": round(savings, 3),
            "hits": sum(n for _, n in saved.values()),
            "money": round(savings / 3600 * price, 2) if price is not None else None,
            "frames": [
                {"frame": f, "label": frame_label(f), "gpu_seconds": round(s, 3), "hits": n} for f, (s, n) in saving
            ],
            "frames_left_out": savings_left_out,
        },
    }


def _costliest(rows: list[T], seconds: Callable[[T], float]) -> tuple[list[T], dict[str, Any]]:
    """The first BILL_ROWS of `rows` (costliest first), and how many the rest are and their GPU-seconds."""
    rest = rows[BILL_ROWS:]
    return rows[:BILL_ROWS], {"count": len(rest), "gpu_seconds": round(sum(seconds(r) for r in rest), 3)}


def _line_json(line: Line) -> dict[str, Any]:
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
    """The run's compiles, with their cache outcome (`outcome_of`: a handful of distinct strings, and a
    row is rebuilt only where the stored one is not already the outcome) and key."""
    rows = list(map(Compile._make, reads.compile_facts(run_id)))
    renamed = {raw: out for raw in {c.outcome for c in rows} if (out := outcome_of(raw)) != raw}
    if renamed:
        rows = [c._replace(outcome=renamed[c.outcome]) if c.outcome in renamed else c for c in rows]
    return rows


def collective_waits(run_id: int, steps: list[int]) -> dict[int, dict[int, float]]:
    """step -> rank -> the longest wait in a collective its progress samples saw in that step."""
    return reads.collective_waits(run_id, steps) if steps else {}


class RunId(TypedDict):
    id: int


def earlier_runs(run: Run) -> QuerySet[Run, RunId]:
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


def in_torch(sites: list[tuple[str, str]]) -> set[str]:
    """The frames whose every graph break (of `reads.break_sites`) is inside torch's own code
    (`remedies.inside_torch`)."""
    inside: dict[str, bool] = {}
    for frame, head in sites:
        inside[frame] = inside.get(frame, True) and remedies.inside_torch(frame, head)
    return {frame for frame, yes in inside.items() if yes}


def devices(run: Run) -> str:
    """What the bill's seconds are seconds of, in words: "GPU" where every rank said it computes on a
    CUDA device (rank_start's `device`), else "device": a CPU job's bill is no GPU time, and a rank that
    has not said where it computes may be on either."""
    return devices_of(Rank.objects.filter(run=run))


def devices_of(ranks: QuerySet[Rank]) -> str:
    """`devices` of several runs' ranks together (a comparison, a project's runs): "GPU" only where
    every one of them said it computes on a CUDA device."""
    said = ranks.aggregate(ranks=Count("id"), gpus=Count("id", filter=Q(info__device__startswith="cuda")))
    return "GPU" if said["ranks"] and said["gpus"] == said["ranks"] else "device"


@contextmanager
def without_collector_pauses() -> Iterator[None]:
    """Python's cycle collector off for the duration. A bill builds tens of thousands of tuples and no
    cycles (reference counting frees all of it), and the passes those allocations set off walk every
    object not frozen (`dashboard.asgi` freezes what the server loaded; a Celery worker's sweep freezes
    nothing): up to a third of a 1,024-rank bill's time."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def bill_of(run: Run, now: datetime | None = None) -> dict[str, Any]:
    """The run's bill (`compute`) from its stored compile events and progress samples."""
    with without_collector_pauses():
        return _bill_of(run, now)


def _bill_of(run: Run, now: datetime | None) -> dict[str, Any]:
    compiles = compile_rows(run.id)
    sites = reads.break_sites(run.id)
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
        breaks=Counter(frame for frame, _ in sites),
        breaks_in_torch=in_torch(sites),
    )
    return {"run": run.key, "project": run.project.name, **bill}
