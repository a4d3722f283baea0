"""Slots: what every rank must report once. Ingest touches them; Celery settles them.

A slot is ready the moment every rank reported it; otherwise the sweep settles it once the
settle timeout has passed since its first report. State lives in PostgreSQL, so nothing is
lost when a worker or the broker restarts.

Compile slots count reports per slot. Grad slots do not: at 1024 ranks that is 1024 updates
of every slot row (the ingest bottleneck). Instead each rank has a watermark (highest step
reported, `GradWatermark`), the first rank to reach a step creates its slot, and
`grads_ready_sql` (after the batch commits, so the last committer always sees every report) marks
the slots below the lowest watermark complete (`reported = world_size`). Reports for a slot that
already settled still count one by one, so a late report reopens it.

A compile slot some ranks never report (one rank recompiled alone) need not wait for the timeout
either: it is complete once every rank has reported progress past its step (`compiles_passed`).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

import msgspec
from django.conf import settings
from django.db import connection
from django.db.models import Count, F, Q
from django.utils import timezone

from agents import protocol
from dashboard.ledger.models import CompileSlot, GradSlot, GradWatermark
from dashboard.tenancy.models import LOST, Rank, Run

COMPILE, GRAD = "compile", "grad"
Ready = tuple[str, int, int]  # a slot to settle: (kind, slot id, run id); the run decides its turn (detection.fairness)
COMPILE_SLOT, GRAD_SLOT = CompileSlot._meta.db_table, GradSlot._meta.db_table
WATERMARK = GradWatermark._meta.db_table
RANK = Rank._meta.db_table
PARAM_PREFIX = "param:"  # weight fingerprints are stored as grad slots of group "param:<group>"


def replicated(group: str) -> bool:
    """Whether the agent knows the group's parameters are replicas (DDP's, a replicated DTensor's);
    the others ("local") are compared once they behave as replicas (`dashboard.detection.replicas`)."""
    return not group.removeprefix(PARAM_PREFIX).startswith("local")


def _compile_reports(
    batches: list[list[protocol.Compile]],
) -> tuple[list[tuple[str, int]], dict[tuple[str, int], int | None], Counter[tuple[str, int]]]:
    """The compile slots some batches report, in key order: (keys, each one's lowest step, how many
    of the batches report it: a batch counts once per slot)."""
    steps: dict[tuple[str, int], int | None] = {}
    reports: Counter[tuple[str, int]] = Counter()
    for compiles in batches:
        reported: set[tuple[str, int]] = set()
        for e in compiles:
            key = (e.frame, e.index)
            steps[key] = min((n for n in (steps.get(key), e.step) if n is not None), default=None)
            reported.add(key)
        reports.update(reported)
    return sorted(steps), steps, reports


def open_compiles(run: Run, batches: list[list[protocol.Compile]]) -> None:
    """Open the compile slots these batches report that no batch opened before (inside their
    transaction, so a report is never stored without its slot); existing slots are left alone and
    unlocked. Their reports are counted after commit (`count_compiles`)."""
    keys, steps, _ = _compile_reports(batches)
    with connection.cursor() as cur:
        cur.execute(
            f"""
            INSERT INTO {COMPILE_SLOT} (run_id, frame, index, step, reported, first_seen, settled_n, dissenters, consensus)
            SELECT %s, k.frame, k.index, k.step, 0, now(), 0, '{{}}', '{{}}'
            FROM unnest(%s::text[], %s::int[], %s::bigint[]) AS k(frame, index, step)
            ORDER BY k.frame, k.index
            ON CONFLICT (run_id, frame, index) DO NOTHING
            """,
            [run.id, [k[0] for k in keys], [k[1] for k in keys], [steps[k] for k in keys]],
        )


def count_compiles(run: Run, batches: list[list[protocol.Compile]]) -> tuple[list[Ready], bool]:
    """Count the compile reports of some committed batches of one run, each batch once per slot it
    reports: (the compile slots they completed, whether they left one incomplete, for
    `compiles_passed`). One statement of its own, after the batches' commit, slots in key order.

    Every batch of a job's start reports the same few slots: counted inside the batches'
    transaction, each group held their rows until its COMMIT, and the groups of every ingest process
    queued on them one commit after the other (at 100,000 ranks a dozen groups waiting at a time,
    the host mostly idle, 40 s to the first step). On its own a count holds them for its statement.
    A process that stops between the commit and the count leaves a slot short: it is then settled
    once every rank has passed it, or at the settle timeout, as a slot some rank never reports is.
    Grad reports are part of ingest's claim statement (`grad_reports_ctes`); their completion by
    watermark is decided after commit (`grads_ready_sql`).
    """
    keys, steps, reports = _compile_reports(batches)
    with connection.cursor() as cur:
        cur.execute(
            f"""
            INSERT INTO {COMPILE_SLOT} (run_id, frame, index, step, reported, first_seen, settled_n, dissenters, consensus)
            SELECT %s, k.frame, k.index, k.step, k.n, now(), 0, '{{}}', '{{}}'
            FROM unnest(%s::text[], %s::int[], %s::bigint[], %s::int[]) AS k(frame, index, step, n)
            ORDER BY k.frame, k.index
            ON CONFLICT (run_id, frame, index) DO UPDATE
              SET reported = {COMPILE_SLOT}.reported + EXCLUDED.reported,
                  step = LEAST({COMPILE_SLOT}.step, EXCLUDED.step)
            RETURNING id, reported
            """,
            [
                run.id,
                [k[0] for k in keys],
                [k[1] for k in keys],
                [steps[k] for k in keys],
                [reports[k] for k in keys],
            ],
        )
        rows = cur.fetchall()
    complete = [(COMPILE, slot_id, run.id) for slot_id, reported in rows if reported >= run.world_size]
    return complete, len(complete) < len(rows)


def compile_mark(run_id: int) -> tuple[int, int]:
    """(compile slots, reports counted on them) of a run: both only grow while its compiles arrive
    (`detection.compile_marks`); one index range of the run's few slots."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*), COALESCE(sum(reported), 0) FROM {COMPILE_SLOT} WHERE run_id = %s", [run_id])
        slots_n, reports = cur.fetchone()
    return int(slots_n), int(reports)


def compiles_waiting_cte(source: str) -> str:
    """CTE `waiting` of ingest's claim statement: whether the run has an incomplete compile slot of a
    step below one of the batches' last steps (CTE `source`, column step), so that `compiles_passed`
    is worth asking after commit. Binds %(run)s, %(ws)s; reads the few unsettled slots
    (index compile_slot_sweep), usually none."""
    return f"""
            waiting AS (
              SELECT EXISTS (SELECT 1 FROM {COMPILE_SLOT} s
                             WHERE s.settled_at IS NULL AND s.run_id = %(run)s::bigint AND s.reported < %(ws)s::int
                               AND s.step < (SELECT max(step) FROM {source})) AS due
            )"""


def compiles_passed(run: Run, start: int) -> list[Ready]:
    """The run's incomplete compile slots that every rank has passed (after the batches commit, so
    the last committer sees every rank's progress). `start`: the rank after the request's highest.

    A rank's events arrive in order (one sender per session, in seq order) and a compile of step N
    is captured before any progress event of step N + 1, so a rank whose last step is past N and
    that did not report the slot did not compile it: nothing more can come, settle now. A rank that
    ended is done too; one whose last step is N is not (a loss it logged before stepping is step N,
    and a compile can follow it), and neither is one that has not reported at all. The slot's
    dissenters are then decided by the settle.

    Whether a rank is still at or below a slot's step, or missing, is a scan of the run's ranks in
    rank order that stops at the first one found (`_rank_behind_or_missing`), from `start` round to
    it, as `grads_ready_sql` scans the watermarks; only a slot that passes it counts the run's ranks
    (the ranks after the last one present are missing too). An aggregate over every rank of the
    run, per request, cost 37 ms at 100,000 ranks; a scan that stopped only at a rank behind still
    read every rank present through a job's start (its early ranks past the compile's step, the
    others not there yet): on a 16-core host, a dozen backends scanning for the start's 40 s.
    """
    with connection.cursor() as cur:
        cur.execute(
            f"""
            WITH passed AS MATERIALIZED (
              SELECT s.id FROM {COMPILE_SLOT} s
              WHERE s.settled_at IS NULL AND s.run_id = %(run)s::bigint AND s.reported < %(ws)s::int
                AND CASE WHEN EXISTS ({_rank_behind_or_missing(">=")}) THEN false
                         WHEN EXISTS ({_rank_behind_or_missing("<")}) THEN false ELSE true END
            )
            SELECT passed.id FROM passed
            CROSS JOIN LATERAL (SELECT count(*) AS n FROM {RANK} r
                                WHERE r.run_id = %(run)s::bigint AND passed.id IS NOT NULL) ranks
            WHERE ranks.n >= %(ws)s::int
            """,
            {"run": run.id, "ws": run.world_size, "start": start},
        )
        return [(COMPILE, row[0], run.id) for row in cur.fetchall()]


def _rank_behind_or_missing(side: str) -> str:
    """A rank still running at or below `s.step`, or missing, among the ranks at or above %(start)s
    (side ">=") or below it ("<"), in rank order: the n-th rank of the range must be first-of-range + n."""
    origin = "%(start)s::int" if side == ">=" else "0"
    return f"""SELECT 1 FROM (SELECT r.rank, r.status, r.last_step, {origin} + row_number() OVER (ORDER BY r.rank) - 1 AS i
                                        FROM {RANK} r
                                        WHERE r.run_id = %(run)s::bigint AND r.rank {side} %(start)s::int
                                        ORDER BY r.rank) r
                                  WHERE r.rank <> r.i
                                     OR (r.status IN ('running', '{LOST}') AND COALESCE(r.last_step, -1) <= s.step)"""


def array_literal(values: list[int]) -> str:
    """A `bigint[]` literal: one string parameter instead of a list psycopg adapts element by element."""
    return "{" + ",".join(map(str, values)) + "}"


def grad_reports_ctes() -> str:
    """The grad part of a claim statement for the batches of several ranks (distinct, one run):
    advance each rank's watermarks, open the slots no rank reported before, count late reports of
    settled slots (CTE `late` returns (id, reported)).

    Binds %(run)s and `grad_reports_params`. All CTEs of a statement read the snapshot from
    before it, so `top` is the highest step any rank had reported (the highest slot: the first
    report of every step opened one, and slots are kept) and the new slots are exactly the
    reported steps above it. Steps travel once per group, not once per rank (with how many
    of the batches reported each), and late reports are looked for by one range scan per group
    of the partial index of settled slots (grad_slot_settled), which usually finds none.
    """
    return f"""
            m AS MATERIALIZED (
              SELECT * FROM json_to_recordset(%(marks)s::json) AS m(g text, rank int, step bigint)
            ), top AS MATERIALIZED (
              SELECT t.g, t.steps::bigint[] AS steps, t.counts::int[] AS counts,
                     (SELECT COALESCE(max(s.step), -1) FROM {GRAD_SLOT} s
                      WHERE s.run_id = %(run)s::bigint AND s."group" = t.g) AS step
              FROM unnest(%(t_group)s::text[], %(t_steps)s::text[], %(t_counts)s::text[]) AS t(g, steps, counts)
            ), mark AS (
              INSERT INTO {WATERMARK} (run_id, "group", rank, step)
              SELECT %(run)s::bigint, m.g, m.rank, m.step FROM m
              ON CONFLICT (run_id, "group", rank) DO UPDATE SET step = GREATEST({WATERMARK}.step, EXCLUDED.step)
            ), opened AS (
              INSERT INTO {GRAD_SLOT} (run_id, step, "group", reported, first_seen, settled_n, dissenters, consensus)
              SELECT %(run)s::bigint, s.step, top.g, 1, now(), 0, '{{}}', '{{}}'
              FROM top CROSS JOIN LATERAL unnest(top.steps) AS s(step) WHERE s.step > top.step
              ORDER BY top.g, s.step
              ON CONFLICT (run_id, step, "group") DO NOTHING
            ), settled AS (
              SELECT s.id, r.n FROM top
              CROSS JOIN LATERAL (SELECT id, step FROM {GRAD_SLOT}
                                  WHERE run_id = %(run)s::bigint AND "group" = top.g
                                    AND step BETWEEN top.steps[1] AND top.step AND settled_at IS NOT NULL) s
              CROSS JOIN LATERAL unnest(top.steps, top.counts) AS r(step, n)
              WHERE r.step = s.step
            ), late AS (
              UPDATE {GRAD_SLOT} SET reported = reported + settled.n FROM settled
              WHERE {GRAD_SLOT}.id = settled.id
              RETURNING {GRAD_SLOT}.id, {GRAD_SLOT}.reported
            )"""


def watermarks_before() -> str:
    """A select expression: {rank: {group: step}} of the watermarks the claim advances (CTE `m` of
    `grad_reports_ctes`), as the statement's snapshot saw them (before its own updates).

    One index lookup per (group, rank) reported, forced: `m` is a function scan the planner guesses
    at 100 rows, and with a young run's statistics it joined them by hash to a bitmap scan of every
    watermark of the run (32,768 rows, 3-52 ms a statement at 16,384 ranks: a cost per request that
    grew with the job). The LIMIT keeps the lateral lookup from being flattened into such a join.
    """
    return f"""(SELECT COALESCE(json_object_agg(rank, marks), '{{}}') FROM (
                      SELECT m.rank, json_object_agg(m.g, w.step) AS marks FROM m
                      CROSS JOIN LATERAL (SELECT step FROM {WATERMARK} w
                                          WHERE w.run_id = %(run)s::bigint AND w."group" = m.g AND w.rank = m.rank
                                          LIMIT 1) w
                      GROUP BY m.rank) w)"""


def grad_reports_params(reports: list[tuple[int, str, list[int]]]) -> dict[str, object]:
    """`reports`: (rank, group, its sorted distinct steps) per rank and replicated group."""
    by_group: dict[str, list[list[int]]] = {}
    for _, group, steps in reports:
        by_group.setdefault(group, []).append(steps)
    union, counts = [], []
    for lists in by_group.values():
        tally = Counter(step for steps in lists for step in steps)
        union.append(sorted(tally))
        counts.append([tally[step] for step in union[-1]])
    marks = [{"g": group, "rank": rank, "step": steps[-1]} for rank, group, steps in reports]
    return {
        "marks": msgspec.json.encode(marks).decode(),
        "t_group": list(by_group),
        "t_steps": [array_literal(steps) for steps in union],
        "t_counts": [array_literal(n) for n in counts],
    }


def grads_ready_sql(groups: int) -> str:
    """CTEs finding the grad slots that every rank's watermark has passed, for `groups` groups
    (after the batches commit): binds %(run)s, %(ws)s, g{i}/floor{i}/start{i}; CTE `done` returns slot ids.

    A slot can only have become complete if one of the reporting ranks was the lowest, so only the
    open slots above their lowest old watermark (the floor) are candidates. Watermarks have no
    index on their step (their updates stay HOT), so whether a rank is still below the lowest
    candidate is a scan of the run's ranks that stops at the first one found, or at the first rank
    with no watermark yet (a gap in the ranks: at a job's start no rank is below the first step).
    The scan starts after the request's highest rank and wraps around (`start`): racks that report
    in rank order have the ranks still to come right after them, where a scan from rank 0 crossed
    every rank already reported (at 100,000 ranks about 10 ms per request, for every request of a
    step). Only a group that passes it (it completes a slot) reads every rank's watermark (the
    lowest, and that every rank has one); `candidate` is materialized so that the planner cannot
    read them first, and the two halves of the scan are a CASE so that it cannot take the second
    half first.
    """
    values = ", ".join(f"(%(g{i})s::text, %(floor{i})s::bigint, %(start{i})s::int)" for i in range(groups))
    return f"""
            candidate AS MATERIALIZED (
              SELECT v.g, v.floor, s.first FROM (VALUES {values}) AS v(g, floor, start)
              CROSS JOIN LATERAL (SELECT min(step) AS first FROM {GRAD_SLOT} s
                                  WHERE s.run_id = %(run)s::bigint AND s."group" = v.g AND s.step > v.floor
                                    AND s.reported < %(ws)s::int) s
              WHERE s.first IS NOT NULL
                AND CASE WHEN EXISTS ({_below_or_missing(">=")}) THEN false
                         WHEN EXISTS ({_below_or_missing("<")}) THEN false ELSE true END
            ), due AS MATERIALIZED (
              SELECT candidate.g, candidate.floor, m.lowest FROM candidate
              CROSS JOIN LATERAL (SELECT min(step) AS lowest, count(*) AS ranks FROM {WATERMARK} w
                                  WHERE w.run_id = %(run)s::bigint AND w."group" = candidate.g) m
              WHERE m.ranks >= %(ws)s::int
            ), done AS (
              UPDATE {GRAD_SLOT} s SET reported = %(ws)s::int FROM due
              WHERE s.run_id = %(run)s::bigint AND s."group" = due.g AND s.step > due.floor AND s.step <= due.lowest
                AND s.reported < %(ws)s::int
              RETURNING s.id
            )"""


def _below_or_missing(side: str) -> str:
    """A rank of `v.g` below `s.first`, or missing, among the ranks at or above `v.start` (side ">=")
    or below it ("<"), in rank order: the n-th watermark of the range must be rank first-of-range + n."""
    origin = "v.start" if side == ">=" else "0"
    return f"""SELECT 1 FROM (SELECT w.rank, w.step, {origin} + row_number() OVER (ORDER BY w.rank) - 1 AS i
                                        FROM {WATERMARK} w
                                        WHERE w.run_id = %(run)s::bigint AND w."group" = v.g AND w.rank {side} v.start
                                        ORDER BY w.rank) w
                                  WHERE w.step < s.first OR w.rank <> w.i"""


def grads_ready_params(before: dict[str, int], groups: list[str], start: int) -> dict[str, object]:
    """`start`: the rank after the request's highest (the scan for ranks still below begins there)."""
    params: dict[str, object] = {}
    for i, group in enumerate(groups):
        params[f"g{i}"] = group
        params[f"floor{i}"] = before.get(group, -1)
        params[f"start{i}"] = start
    return params


def unsettled(run_id: int) -> bool:
    """Whether the run has a slot still to settle (never settled, or reported to since)."""
    pending = Q(settled_at__isnull=True) | Q(reported__gt=F("settled_n"))
    return any(model.objects.filter(pending, run_id=run_id).exists() for model in (CompileSlot, GradSlot))


def overdue(model: type[CompileSlot | GradSlot], now: datetime | None = None) -> dict[int, int]:
    """Pending slots whose settle timeout has passed: slot id -> run id."""
    cutoff = (now or timezone.now()) - timedelta(seconds=settings.LOCKSTEP_SETTLE_TIMEOUT)
    table = model._meta.db_table
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT id, run_id FROM {table} WHERE first_seen < %s AND (settled_at IS NULL OR reported > settled_n) "
            "LIMIT 5000",
            [cutoff],
        )
        return dict(cur.fetchall())


MODELS: dict[str, type[CompileSlot | GradSlot]] = {COMPILE: CompileSlot, GRAD: GradSlot}


def quarantine(kind: str, slot_id: int) -> int | None:
    """A slot whose settle raised: settled without a verdict and marked, so the sweep stops retrying
    it (every sweep failing on it again stopped nothing else, but cost a failure every 2 s for ever)
    while the other slots settle; a later report of it tries once more. Returns its run's id."""
    now = timezone.now()
    model = MODELS[kind]
    model.objects.filter(id=slot_id).update(settled_at=now, settled_n=F("reported"), quarantined_at=now)
    return model.objects.filter(id=slot_id).values_list("run_id", flat=True).first()


def quarantined_by_project() -> dict[int, int]:
    """project id -> its quarantined slots (both kinds), read through the partial indexes."""
    out: dict[int, int] = {}
    for model in MODELS.values():
        rows = model.objects.filter(quarantined_at__isnull=False).values_list("run__project_id").annotate(n=Count("id"))
        for project_id, n in rows.order_by():
            out[project_id] = out.get(project_id, 0) + n
    return out
