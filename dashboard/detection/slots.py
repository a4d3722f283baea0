"""Slots: what every rank must report once. Ingest touches them; Celery settles them.

A slot is ready the moment every rank reported it; otherwise the sweep settles it once the
settle timeout has passed since its first report. State lives in PostgreSQL, so nothing is
lost when a worker or the broker restarts.
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


def replicated(group: str) -> bool:
    """Only groups the agent saw evidence of replication for are compared across ranks."""
    return not group.startswith("local")


def touch(run: Run, compiles: list[protocol.Compile], grads: list[protocol.Grad]) -> list[tuple[str, int]]:
    """Count this batch's reports per slot; return the slots every rank has now reported."""
    compile_keys = sorted({(e.frame, e.index) for e in compiles})
    grad_keys = sorted({(e.step, e.group) for e in grads if replicated(e.group)})
    ready = [(COMPILE, i) for i in _upsert("dashboard_compileslot", ("frame", "index"), ("text", "int"), compile_keys, run)]
    ready += [(GRAD, i) for i in _upsert("dashboard_gradslot", ("step", "group"), ("bigint", "text"), grad_keys, run)]
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
