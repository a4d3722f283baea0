"""Slots: what every rank must report once. Ingest touches them; Celery settles them.

A slot is ready the moment every rank reported it; otherwise the sweep settles it once the
settle timeout has passed since its first report. State lives in PostgreSQL, so nothing is
lost when a worker or the broker restarts.

Compile slots count reports per slot. Grad slots do not: at 1024 ranks that is 1024 updates
of every slot row (the ingest bottleneck). Instead each rank has a watermark (highest step
reported, `ingest.models.GradWatermark`), the first rank to reach a step creates its slot, and
`grads_ready` (after the batch commits, so the last committer always sees every report) marks
the slots below the lowest watermark complete (`reported = world_size`). Reports for a slot that
already settled still count one by one, so a late report reopens it.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from agents import protocol
from ingest.models import CompileEvent, GradReport, Rank, Run

COMPILE, GRAD = "compile", "grad"
PARAM_PREFIX = "param:"  # weight fingerprints are stored as grad slots of group "param:<group>"


def replicated(group: str) -> bool:
    """Only groups the agent saw evidence of replication for are compared across ranks."""
    return not group.removeprefix(PARAM_PREFIX).startswith("local")


def touch(run: Run, compiles: list[protocol.Compile], grads: list[protocol.Grad], rank: int = 0) -> list[tuple[str, int]]:
    """Record this batch's reports (inside its transaction); return the slots it completed.

    `grads` needs only `.step` and `.group` per rank-step. Grad completion by watermark is
    decided by `grads_ready` after commit; here only late reports of settled grad slots count.
    """
    compile_keys = sorted({(e.frame, e.index) for e in compiles})
    ready = [(COMPILE, i) for i in _upsert("dashboard_compileslot", ("frame", "index"), ("text", "int"), compile_keys, run)]
    for group, steps in grad_steps_by_group(grads):
        ready += [(GRAD, i) for i in _grad_reports(run, rank, group, steps)]
    return ready


def _steps_literal(steps: list[int]) -> str:
    """A `bigint[]` literal: one string parameter instead of a list psycopg adapts element by element."""
    return "{" + ",".join(map(str, steps)) + "}"


def grad_report_ctes(i: int) -> str:
    """One group's part of a batch statement: advance the rank's watermark, open slots no rank
    reported before, count late reports of settled slots (CTE `late{i}` returns (id, reported)).

    Binds %(run)s, %(rank)s and `grad_report_params(i, ...)`. All CTEs of a statement read the
    snapshot from before it, so `top{i}` is the highest step any rank had reported and the new
    slots are exactly this batch's steps above it.
    """
    return f"""
            top{i} AS (
              SELECT COALESCE(max(step), -1) AS step FROM ingest_gradwatermark
              WHERE run_id = %(run)s::bigint AND "group" = %(g{i})s::text
            ), mark{i} AS (
              INSERT INTO ingest_gradwatermark (run_id, "group", rank, step)
              VALUES (%(run)s::bigint, %(g{i})s::text, %(rank)s::int, %(l{i})s::bigint)
              ON CONFLICT (run_id, "group", rank) DO UPDATE SET step = GREATEST(ingest_gradwatermark.step, EXCLUDED.step)
            ), opened{i} AS (
              INSERT INTO dashboard_gradslot (run_id, step, "group", reported, first_seen, settled_n, dissenters, consensus)
              SELECT %(run)s::bigint, s, %(g{i})s::text, 1, now(), 0, '{{}}', '{{}}' FROM unnest(%(s{i})s::bigint[]) AS s, top{i}
              WHERE s > top{i}.step
              ON CONFLICT (run_id, step, "group") DO NOTHING
            ), late{i} AS (
              UPDATE dashboard_gradslot SET reported = reported + 1 FROM top{i}
              WHERE run_id = %(run)s::bigint AND "group" = %(g{i})s::text AND dashboard_gradslot.step = ANY(%(s{i})s::bigint[])
                AND dashboard_gradslot.step BETWEEN %(f{i})s::bigint AND top{i}.step AND settled_at IS NOT NULL
              RETURNING id, reported
            )"""


def grad_report_params(i: int, group: str, steps: list[int]) -> dict:
    """`steps`: sorted, distinct."""
    return {f"g{i}": group, f"s{i}": _steps_literal(steps), f"f{i}": steps[0], f"l{i}": steps[-1]}


def grad_steps_by_group(grads) -> list[tuple[str, list[int]]]:
    """Replicated groups of these rank-steps (anything with `.step` and `.group`), each with its sorted distinct steps."""
    by_group: dict[str, set[int]] = {}
    for e in grads:
        if replicated(e.group):
            by_group.setdefault(e.group, set()).add(e.step)
    return [(group, sorted(steps)) for group, steps in sorted(by_group.items())]


def _grad_reports(run: Run, rank: int, group: str, steps: list[int]) -> list[int]:
    """Advance the rank's watermark, open slots no rank reported before, count late reports (one statement)."""
    with connection.cursor() as cur:
        cur.execute(
            "WITH" + grad_report_ctes(0) + " SELECT id, reported FROM late0",
            {"run": run.id, "rank": rank, **grad_report_params(0, group, steps)},
        )
        return [slot_id for slot_id, reported in cur.fetchall() if reported >= run.world_size]


def grads_ready_sql(groups: int) -> str:
    """Statement part of `grads_ready` for `groups` groups: binds %(run)s, %(ws)s, g{i}/floor{i}; returns slot ids.

    A slot can only have become complete if this rank was the lowest, so only steps above its
    old watermark (the floor) are looked at; the watermark count is only read when the lowest
    watermark moved past the floor (the rare case: usually another rank is still behind).
    """
    values = ", ".join(f"(%(g{i})s::text, %(floor{i})s::bigint)" for i in range(groups))
    return f"""
            lows AS MATERIALIZED (
              SELECT v.g, v.floor, m.lowest FROM (VALUES {values}) AS v(g, floor)
              CROSS JOIN LATERAL (SELECT min(step) AS lowest FROM ingest_gradwatermark w
                                  WHERE w.run_id = %(run)s::bigint AND w."group" = v.g) m
            ), due AS MATERIALIZED (
              SELECT g, floor, lowest FROM lows
              WHERE CASE WHEN lowest > floor THEN (SELECT count(*) FROM ingest_gradwatermark w
                                                   WHERE w.run_id = %(run)s::bigint AND w."group" = lows.g) >= %(ws)s::int
                         ELSE false END
            ), done AS (
              UPDATE dashboard_gradslot s SET reported = %(ws)s::int FROM due
              WHERE s.run_id = %(run)s::bigint AND s."group" = due.g AND s.step > due.floor AND s.step <= due.lowest
                AND s.reported < %(ws)s::int
              RETURNING s.id
            )"""


def grads_ready_params(before: dict[str, int], groups: list[str]) -> dict:
    params = {}
    for i, group in enumerate(groups):
        params[f"g{i}"] = group
        params[f"floor{i}"] = before.get(group, -1)
    return params


def grads_ready(run: Run, before: dict[str, int], groups: set[str]) -> list[tuple[str, int]]:
    """After commit: grad slots that every rank's watermark has now passed, each returned once.

    A slot can only have become complete if this rank was the lowest, so only steps above its
    old watermark (`before`, read in the batch's transaction before it moved) are looked at; of two ranks committing at once, the later sees both.
    """
    if not groups:
        return []
    ordered = sorted(groups)
    with connection.cursor() as cur:
        cur.execute("WITH" + grads_ready_sql(len(ordered)) + " SELECT id FROM done",
                    {"run": run.id, "ws": run.world_size, **grads_ready_params(before, ordered)})
        return [(GRAD, row[0]) for row in cur.fetchall()]


def _upsert(table: str, cols: tuple[str, str], types: tuple[str, str], keys: list[tuple], run: Run) -> list[int]:
    if not keys:
        return []
    a, b = cols
    with connection.cursor() as cur:
        cur.execute(
            f"""
            INSERT INTO {table} (run_id, "{a}", "{b}", reported, first_seen, settled_n, dissenters, consensus)
            SELECT %s, k.a, k.b, 1, now(), 0, '{{}}', '{{}}'
            FROM unnest(%s::{types[0]}[], %s::{types[1]}[]) AS k(a, b)
            ON CONFLICT (run_id, "{a}", "{b}") DO UPDATE SET reported = {table}.reported + 1
            RETURNING id, reported
            """,
            [run.id, [k[0] for k in keys], [k[1] for k in keys]],
        )
        return [slot_id for slot_id, reported in cur.fetchall() if reported >= run.world_size]


def overdue(model, now: datetime | None = None) -> list[int]:
    """Pending slots whose settle timeout has passed."""
    cutoff = (now or timezone.now()) - timedelta(seconds=settings.LOCKSTEP_SETTLE_TIMEOUT)
    table = model._meta.db_table
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT id FROM {table} WHERE first_seen < %s AND (settled_at IS NULL OR reported > settled_n) LIMIT 5000",
            [cutoff],
        )
        return [row[0] for row in cur.fetchall()]


@dataclass
class RankState:
    """Where every rank is when a compile slot settles.

    A rank that completed the step a compile happened in, without reporting that compile, did
    not compile it: its events arrive in order, so the compile would have come before that
    step's gradients. A rank that is still before that step (compiling, or just slow) is not
    judged yet; one that stopped reporting altogether is rank_silent's business.
    """

    last_step: dict[int, int | None]
    last_seen: dict[int, datetime]
    ended: set[int]

    def accountable(self, step: int | None, since: datetime) -> set[int]:
        """Ranks whose absence from a slot means 'did not do it', not 'no data (yet)'."""
        if step is None:  # a compile outside the training steps: anything sent since it counts
            passed = {r for r, seen in self.last_seen.items() if seen >= since}
        else:
            passed = {r for r, last in self.last_step.items() if last is not None and last >= step}
        return passed | self.ended

    def behind(self, step: int | None, since: datetime, reported: set[int], now: datetime, silent_after: float) -> set[int]:
        """Live ranks that may still report the slot: worth waiting for."""
        judged = self.accountable(step, since) | reported
        return {r for r, seen in self.last_seen.items()
                if r not in judged and (now - seen).total_seconds() < silent_after}


def rank_state(run: Run) -> RankState:
    rows = list(Rank.objects.filter(run=run).values_list("rank", "last_step", "last_seen", "status"))
    return RankState(
        last_step={r: last for r, last, _, _ in rows},
        last_seen={r: seen for r, _, seen, _ in rows},
        ended={r for r, _, _, status in rows if status != "running"},
    )


def compile_reports(slot) -> dict[int, CompileEvent]:
    events = CompileEvent.objects.filter(run_id=slot.run_id, frame=slot.frame, index=slot.index).order_by("id")
    return {e.rank: e for e in events}


@dataclass(frozen=True)
class GradRow:
    """What the rules read of one rank's report: plain values, not ORM objects (1024 per slot)."""

    fps: tuple[int, ...]
    nonfinite: int
    norm: float | None


def grad_reports(slot) -> dict[int, GradRow]:
    rows = (GradReport.objects.filter(run_id=slot.run_id, step=slot.step, group=slot.group).order_by("id")
            .values_list("rank", "fps", "nonfinite", "norm"))
    return {rank: GradRow(tuple(fps), nonfinite, norm) for rank, fps, nonfinite, norm in rows}
