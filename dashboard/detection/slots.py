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
    by_group: dict[str, list[int]] = {}
    for e in grads:
        if replicated(e.group):
            by_group.setdefault(e.group, []).append(e.step)
    for group, steps in sorted(by_group.items()):
        ready += [(GRAD, i) for i in _grad_reports(run, rank, group, sorted(set(steps)))]
    return ready


def _grad_reports(run: Run, rank: int, group: str, steps: list[int]) -> list[int]:
    """Advance the rank's watermark, open slots no rank reported before, count late reports.

    One statement: every part reads the snapshot from before it, so `top` is the highest step
    any rank had reported and new slots are exactly this batch's steps above it.
    """
    with connection.cursor() as cur:
        cur.execute(
            """
            WITH top AS (
              SELECT COALESCE(max(step), -1) AS step FROM ingest_gradwatermark WHERE run_id = %(run)s AND "group" = %(group)s
            ), mark AS (
              INSERT INTO ingest_gradwatermark (run_id, "group", rank, step) VALUES (%(run)s, %(group)s, %(rank)s, %(last)s)
              ON CONFLICT (run_id, "group", rank) DO UPDATE SET step = GREATEST(ingest_gradwatermark.step, EXCLUDED.step)
            ), opened AS (
              INSERT INTO dashboard_gradslot (run_id, step, "group", reported, first_seen, settled_n, dissenters, consensus)
              SELECT %(run)s, s, %(group)s, 1, now(), 0, '{}', '{}' FROM unnest(%(steps)s::bigint[]) AS s, top WHERE s > top.step
              ON CONFLICT (run_id, step, "group") DO NOTHING
            )
            UPDATE dashboard_gradslot SET reported = reported + 1 FROM top
            WHERE run_id = %(run)s AND "group" = %(group)s AND dashboard_gradslot.step = ANY(%(steps)s::bigint[])
              AND dashboard_gradslot.step BETWEEN %(first)s AND top.step AND settled_at IS NOT NULL
            RETURNING id, reported
            """,
            {"run": run.id, "group": group, "rank": rank, "steps": steps, "first": steps[0], "last": steps[-1]},
        )
        return [slot_id for slot_id, reported in cur.fetchall() if reported >= run.world_size]


def grads_ready(run: Run, before: dict[str, int], groups: set[str]) -> list[tuple[str, int]]:
    """After commit: grad slots that every rank's watermark has now passed, each returned once.

    A slot can only have become complete if this rank was the lowest, so only steps above its
    old watermark (`before`, read in the batch's transaction before it moved) are looked at; of two ranks committing at once, the later sees both.
    """
    ready = []
    with connection.cursor() as cur:
        for group in sorted(groups):
            floor = before.get(group, -1)
            cur.execute('SELECT min(step) FROM ingest_gradwatermark WHERE run_id = %s AND "group" = %s', [run.id, group])
            lowest = cur.fetchone()[0]
            if lowest is None or lowest <= floor:  # the usual case: another rank is still behind
                continue
            cur.execute(
                """
                UPDATE dashboard_gradslot SET reported = %(ws)s
                WHERE run_id = %(run)s AND "group" = %(group)s AND step > %(floor)s AND step <= %(lowest)s
                  AND reported < %(ws)s
                  AND (SELECT count(*) FROM ingest_gradwatermark WHERE run_id = %(run)s AND "group" = %(group)s) >= %(ws)s
                RETURNING id
                """,
                {"run": run.id, "group": group, "ws": run.world_size, "floor": floor, "lowest": lowest},
            )
            ready += [(GRAD, row[0]) for row in cur.fetchall()]
    return ready


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
    """What is known of every rank when a slot settles: who is alive, who ended, who went silent."""

    reported_since: set[int]  # ranks that sent anything after the slot opened
    ended: set[int]

    def accountable(self) -> set[int]:
        """Ranks whose absence from a slot means 'did not do it', not 'no data'."""
        return self.reported_since | self.ended


def rank_state(run: Run, since: datetime) -> RankState:
    rows = Rank.objects.filter(run=run).values_list("rank", "last_seen", "status")
    return RankState(
        reported_since={r for r, seen, _ in rows if seen >= since},
        ended={r for r, _, status in rows if status != "running"},
    )


def compile_reports(slot) -> dict[int, CompileEvent]:
    events = CompileEvent.objects.filter(run_id=slot.run_id, frame=slot.frame, index=slot.index).order_by("id")
    return {e.rank: e for e in events}


def grad_reports(slot) -> dict[int, GradReport]:
    reports = GradReport.objects.filter(run_id=slot.run_id, step=slot.step, group=slot.group).order_by("id")
    return {r.rank: r for r in reports}
