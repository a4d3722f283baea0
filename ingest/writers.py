"""Write validated batches: all-or-nothing per request, idempotent per (session, seq).

One transaction per group of requests (`ingest.groupcommit`; a request is one rank's batch or a
relay's several): each request's (session, seq) claims, rank/run facts, raw rows and slot
counters commit together or not at all, so a request is either accepted whole or can be resent
whole, and a request the group cannot take leaves it without taking its neighbours along.
This module is what one group writes: each batch prepared off the database, the order of its
writes, the claim statement. The raw rows and the claims' table are evidence's to write
(`dashboard.evidence.writes`, by binary COPY); when a failed group is tried again is `ingest.retries`.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, cast

import msgspec
from django.db import DatabaseError, transaction

from agents import protocol
from dashboard.evidence import partitions, writes
from dashboard.evidence.binary_copy import GradEvents, query
from dashboard.ledger import details, slots
from dashboard.tenancy import sql as tenancy_sql
from dashboard.tenancy.models import Project, Run
from ingest import quotas, retries
from ingest.refusals import Refusal


@dataclass
class Stored:
    accepted: int
    duplicate: bool = False
    ready: list[slots.Ready] = field(default_factory=list)
    graph_hashes: list[str] = field(default_factory=list)
    rank_steps: int = 0
    run_id: int | None = None
    detail: list[int] | None = None  # steps of detail requests handed to this rank (None: not looked up)


def digest(body: bytes) -> str:
    """A batch's identity for resends: the same on both endpoints (a bulk body carries each batch's exact bytes)."""
    return hashlib.sha256(body.strip()).hexdigest()


class _Resent(Exception):
    """A (session, seq) claim failed: roll the group's writes back, then tell a resend from a conflict."""

    def __init__(self, written: _Written):
        self.written = written


class _Refused(Exception):
    """A batch the database would take but the run forbids (a changed world size, a run past the project's
    runs per hour): its request is refused."""

    def __init__(self, job: int, refusal: Refusal):
        self.job = job
        self.refusal = refusal


@dataclass
class Prepared:
    """What one batch needs written, worked out without the database when its request is decoded
    (`Job`): on the event loop, while the process's writer thread writes the group before, whose
    transaction then holds only the database's work."""

    batch: protocol.Batch
    digest: str
    by_type: Mapping[type, list[Any]]  # its events by kind, gradient ones (`grads`) left out
    grads: GradEvents
    last_step: int | None  # its last completed step (`_last_step`), for the rank's facts and the run's liveness
    claim: dict[str, Any]  # its row of the claim statement (`_claim`)
    graph_hashes: list[str]
    kinds: Counter[str | int | None]  # events per wire tag, for /metrics
    detail_steps: set[int]  # steps of the `detail` answers it carries


_NO_OTHER_EVENTS: Mapping[type, list[Any]] = MappingProxyType({})


ONE_GRADS: Counter[str | int | None] = Counter(
    {"grads": 1}
)  # the steady state's tally, shared and read only (`groupcommit._Tally`)


def prepare(batch: protocol.Batch, body_digest: str) -> Prepared:
    events = batch.events
    if len(events) == 1 and type(events[0]) is protocol.Grads:  # the steady state: one packed grads event
        last_step: int | None = events[0].step_numbers()[-1]
        return Prepared(
            batch,
            body_digest,
            _NO_OTHER_EVENTS,
            GradEvents(cast(list[protocol.Grads], events), []),
            last_step,
            _claim_row(batch, body_digest, None, last_step, None),
            [],
            ONE_GRADS,
            set(),
        )
    if all(type(e) is protocol.Grads for e in events):
        by_type, grads = _NO_OTHER_EVENTS, GradEvents(cast(list[protocol.Grads], events), [])
    else:
        by_type = defaultdict(list)
        for event in events:
            by_type[type(event)].append(event)
        grads = GradEvents(
            by_type.pop(protocol.Grads, []),
            by_type.pop(protocol.Grad, []) + [_weights_as_grad(e) for e in by_type.pop(protocol.Param, [])],
        )
    last_step = _last_step(events)
    start = by_type[protocol.RankStart][-1] if protocol.RankStart in by_type else None
    progress = by_type[protocol.Progress][-1] if protocol.Progress in by_type else None
    return Prepared(
        batch,
        body_digest,
        by_type,
        grads,
        last_step,
        _claim_row(batch, body_digest, start, last_step, progress),
        _graph_hashes(by_type[protocol.Compile]) if protocol.Compile in by_type else [],
        Counter(type(e).__struct_config__.tag for e in events),
        {e.step for e in by_type[protocol.Detail]} if protocol.Detail in by_type else set(),
    )


def _claim_row(
    batch: protocol.Batch,
    body_digest: str,
    start: protocol.RankStart | None,
    last_step: int | None,
    progress: protocol.Progress | None,
) -> dict[str, Any]:
    """The batch's row of the claim statement's JSON document (`_claim`): with its latest progress
    sample, which becomes its rank's (`tenancy.sql.ranks_seen_cte`)."""
    return {
        "session": batch.session,
        "seq": batch.seq,
        "digest": body_digest,
        "rank": batch.rank,
        "events": len(batch.events),
        "host": start.host if start else "",
        "pid": start.pid if start else None,
        "info": start,
        "step": last_step,
        "progress": progress,
    }


@dataclass
class Job:
    """One request's batches (one rank's, or a node relay's several, each with its body's digest)
    and their project; each batch is prepared (`prepare`) as the job is made."""

    project: Project
    items: list[tuple[protocol.Batch, str]]
    bulk: bool = False
    size: int = 0  # bytes of its request's body, inflated: what it holds in memory while it queues, roughly
    prepared: list[Prepared] = field(init=False)

    def __post_init__(self) -> None:
        self.prepared = [prepare(batch, body_digest) for batch, body_digest in self.items]


Outcome = list[Stored] | Exception  # a request's answer per batch, or why it was refused (Refusal, DatabaseError)


@dataclass
class _Written:
    """One batch's part of the transaction, and what its after-commit part needs."""

    job: int
    index: int  # within its job
    p: Prepared
    run: Run
    ready: list[slots.Ready]  # slots it completed: compile slots, late grad reports, grad slots after commit
    compiles_open: bool = False  # a compile slot it reported, or one the run has open below its step, is incomplete
    before: dict[str, int] = field(default_factory=dict)
    asked: list[int] = field(default_factory=list)


def store(batch: protocol.Batch, project: Project, body_digest: str) -> Stored:
    """One rank's batch, on its own."""
    outcome = store_group([Job(project, [(batch, body_digest)])])[0]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome[0]


def store_group(jobs: list[Job]) -> list[Outcome]:
    """Write the batches of several requests in one transaction (`ingest.groupcommit`), each request
    all or nothing and answered on its own.

    Round trips of a steady group: BEGIN, one COPY (2) of every batch's grad rows, one prepared
    statement per run for the claims, the ranks' facts, watermarks, slots and detail requests,
    COMMIT, then run liveness once per run and the slots its batches completed. Rows are
    written before the claims, so their row locks are held only until COMMIT. A batch the group
    holds twice (a resend that caught up with its original: a relay's retry, a timed-out request)
    is told apart before anything is written, since the claim statement's conflict would roll back
    the very claim the resend is compared with: a request holding a batch that an earlier request of
    the group holds is written in a group of its own after this one commits, where it answers as
    any resend does (whichever of the two was refused, the other is stored); a request holding one
    batch twice stores it once (the second copy a duplicate, or the request a 409). A batch already
    received in an earlier commit (a resend, rare) rolls the group back; it is then written again without that
    batch, which answers as a duplicate, or without its request, refused whole (409), when its
    content differs; a request whose run forbids a batch (400) leaves the same way. A deadlock or
    serialization failure (a concurrent group won a race) is tried again, up to `retries.RACE_ATTEMPTS`
    times in all. Any other database error of a group is retried request by request, so only
    the request that causes it is refused (422 or 503) and its neighbours are stored.
    """
    now = datetime.now(UTC)
    try:
        partitions.ensure_around(now)  # before the transaction: partition DDL never waits on row locks
    except DatabaseError as exc:
        return [exc] * len(jobs)
    later = _resends_of_earlier(jobs)
    apart: dict[int, Outcome] = {}  # requests answered outside the group's transaction: refused, or stored alone
    duplicates: set[tuple[int, int]] = set()
    attempt = 0
    written: list[tuple[int, _Written | None]] = []
    while live := [j for j in range(len(jobs)) if j not in apart and j not in later]:
        try:
            with transaction.atomic():
                written = _write_all(jobs, live, duplicates, now)
            break
        except _Refused as exc:
            apart[exc.job] = exc.refusal
        except _Resent as resent:
            w = resent.written
            claimed = writes.claim_of(w.run, w.p.batch.session, w.p.batch.seq, w.p.digest)
            if claimed == "same":
                duplicates.add((w.job, w.index))
            elif claimed == "none":  # claimed by a group that then rolled back: nothing holds it now
                apart[w.job] = Refusal(503, "batch claimed by a concurrent request that failed; retry")
            else:
                apart[w.job] = _conflict(jobs[w.job], w.index, w.p.batch)
        except DatabaseError as exc:
            attempt += 1
            forget_runs()
            if retries.lost_a_race(exc) and attempt < retries.RACE_ATTEMPTS:
                retries.back_off(attempt)
                continue
            # A lock or statement timeout is no batch's fault (each alone would wait again); otherwise one
            # request's batch may be the cause: each request on its own.
            alone = len(live) == 1 or retries.busy(exc)
            apart.update({j: exc if alone else store_group([jobs[j]])[0] for j in live})
            written = []
            break
    stored = _after_commit([w for _, w in written])
    if later:
        apart.update(zip(later, store_group([jobs[j] for j in later])))
    stored_of: dict[int, list[Stored]] = {}
    for (j, _), one in zip(written, stored):
        stored_of.setdefault(j, []).append(one)
    return [apart[j] if j in apart else stored_of.get(j, []) for j in range(len(jobs))]


def _write_all(
    jobs: list[Job], live: list[int], duplicates: set[tuple[int, int]], now: datetime
) -> list[tuple[int, _Written | None]]:
    """Each batch's own rows, then one COPY of every batch's grad rows, then the claims, then the
    compile slots no batch opened before (their counts come after commit); (job, its written batch or
    None for a duplicate) per batch, in the jobs' order."""
    written: list[tuple[int, _Written | None]] = []
    runs: dict[tuple[int, str], Run] = {}  # the group's runs: a job's start has hundreds of batches of one new run
    for j in live:
        job = jobs[j]
        first_copy: dict[Identity, str] = {}  # a batch's identity in this request -> its digest
        for i, prepared in enumerate(job.prepared):
            identity = _identity(job, prepared)
            if identity in first_copy:  # the request holds this batch twice
                if first_copy[identity] != prepared.digest:
                    raise _Refused(j, _conflict(job, i, prepared.batch))
                written.append((j, None))
                continue
            first_copy[identity] = prepared.digest
            try:
                run = None if (j, i) in duplicates else _run(prepared.batch, job.project, runs)
            except Refusal as refusal:  # a changed world size, a run past the quota
                raise _Refused(j, refusal.within(f"batches[{i}]") if job.bulk else refusal) from None
            written.append((j, _Written(j, i, prepared, run, []) if run else None))
    fresh = [w for _, w in written if w]
    writes.write_events([(w.run, w.p.batch.rank, w.p.by_type) for w in fresh], now)
    writes.write_grads([(w.run.id, w.p.batch.rank, w.p.grads) for w in fresh], now)
    _claim_all(fresh)
    _open_compile_slots(fresh)
    return written


Identity = tuple[int, str, str, int]


def _identity(job: Job, p: Prepared) -> Identity:
    """What a batch's claim is unique on: its run (the project's key) and its (session, seq)."""
    return job.project.id, p.batch.run.key, p.batch.session, p.batch.seq


def _resends_of_earlier(jobs: list[Job]) -> list[int]:
    """The requests holding a batch that an earlier request of the group holds (`store_group`)."""
    seen: set[Identity] = set()
    later = []
    for j, job in enumerate(jobs):
        identities = {_identity(job, p) for p in job.prepared}
        if identities & seen:
            later.append(j)
        seen |= identities
    return later


def _conflict(job: Job, index: int, batch: protocol.Batch) -> Refusal:
    """409 for a (session, seq) already received with other content: its request is refused whole."""
    return Refusal(
        409,
        f"batch seq {batch.seq} of session {batch.session} was already received with other content",
        f"batches[{index}].seq" if job.bulk else "seq",
    )


def _compiles_by_run(written: list[_Written]) -> dict[int, list[_Written]]:
    """The batches that report compiles, by run."""
    runs: dict[int, list[_Written]] = {}
    for w in written:
        if protocol.Compile in w.p.by_type:
            runs.setdefault(w.run.id, []).append(w)
    return runs


def _open_compile_slots(written: list[_Written]) -> None:
    """Open the compile slots the group's batches report for the first time, one statement per run
    (their reports are counted after commit: `_count_compiles`)."""
    for of_run in _compiles_by_run(written).values():
        slots.open_compiles(of_run[0].run, [w.p.by_type[protocol.Compile] for w in of_run])


def _count_compiles(of_run: list[_Written]) -> None:
    """After commit, count the compile reports of a run's batches, one statement: a job's start is every
    rank reporting the same few slots, and counted inside the group's transaction each group held
    their rows until its COMMIT. What completes or stays open goes to the run's first batch."""
    compiling = [w for w in of_run if protocol.Compile in w.p.by_type]
    if compiling:
        ready, left_open = slots.count_compiles(of_run[0].run, [w.p.by_type[protocol.Compile] for w in compiling])
        of_run[0].ready += ready
        of_run[0].compiles_open |= left_open


def _weights_as_grad(e: protocol.Param) -> protocol.Grad:
    """Weight fingerprints ride the gradient pipeline (slots, consensus) in their own group."""
    return protocol.Grad(step=e.step, group=slots.PARAM_PREFIX + e.group, fps=e.fps, ts=e.ts)


def _graph_hashes(compiles: list[protocol.Compile]) -> list[str]:
    """Normalized artifact hashes in the content-address form (`protocol.blob_hash`) the blob store keys on."""
    return sorted({h.norm for e in compiles for h in e.hashes.values() if len(h.norm) == 32})


RUN_CACHE_S = 60.0
_runs: dict[tuple[int, str], tuple[float, Run]] = {}  # (project, key) -> (expires, run): world_size never changes


def forget_runs() -> None:
    """After a database error: a cached run may be gone (deleted), so look every run up again."""
    _runs.clear()


def _run(batch: protocol.Batch, project: Project, group: dict[tuple[int, str], Run]) -> Run:
    """The project's run of the batch's key, created by its first batch: keys are per project, so
    another project's run of the same key is neither touched nor revealed. `group`: the runs this
    transaction already looked up."""
    info = batch.run
    cache_key = (project.id, info.key)
    cached = _runs.get(cache_key)
    if cache_key in group:
        run = group[cache_key]
    elif cached and cached[0] > time.monotonic():
        run = cached[1]
    else:
        run = group[cache_key] = Run.objects.filter(project=project, key=info.key).first() or _new_run(project, info)
        # remembered once committed: a run created by a batch that then rolled back does not exist
        transaction.on_commit(lambda: _runs.__setitem__(cache_key, (time.monotonic() + RUN_CACHE_S, run)))
    if run.world_size != info.world_size:
        raise Refusal(
            400, f"world_size changed from {run.world_size} to {info.world_size} within run", "run.world_size"
        )
    return run


def _new_run(project: Project, info: protocol.RunInfo) -> Run:
    """The run a batch names for the first time, within the project's runs per hour (a 429 past it)."""
    quotas.check_new_run(project)
    return Run.reported(project, info.key, info.name or info.key, info.world_size, info.meta)


def _claim_all(written: list[_Written]) -> None:
    """Claim every batch's (session, seq) and record its facts: one statement per run, for batches of
    distinct ranks and sessions (a rank's or session's n-th batch in one group, rare for n > 1, goes
    into the n-th statement: a statement updates each rank's and each session's row once)."""
    nth: Counter[tuple[int, int | str]] = Counter()
    waves: dict[tuple[int, int], list[_Written]] = {}
    for w in written:
        keys = ((w.run.id, w.p.batch.rank), (w.run.id, w.p.batch.session))
        n = max(nth[key] for key in keys)
        for key in keys:
            nth[key] = n + 1
        waves.setdefault((w.run.id, n), []).append(w)
    for wave in waves.values():
        _claim(wave)


def _claim(wave: list[_Written]) -> None:
    """Claim (session, seq) of each batch, record the ranks' facts, report the grad steps and hand
    out detail requests, in one statement.

    Sets on each `_Written` its rank's grad watermarks from before (for `grads_ready_sql` after
    commit) and the steps of its rank's detail requests (`DetailRequest`, each handed out once; inside the transaction, so a
    resend rolls the hand-out back), and adds the settled grad slots that late reports completed
    to the first batch's `ready`. Raises `_Resent` for a batch whose (session, seq) was already
    claimed. A rank_end's status is written by a second statement (`_record_ends`):
    ON CONFLICT DO UPDATE sees only the proposed row, which cannot say "this batch ended".
    """
    run = wave[0].run
    params = {
        # the batches as one JSON document (encoded in C) rather than nine arrays psycopg adapts element by element
        "run": run.id,
        "ws": run.world_size,
        "batches": msgspec.json.encode([w.p.claim for w in wave]).decode(),
        "rank": slots.array_literal([w.p.batch.rank for w in wave]),
        **slots.grad_reports_params(
            [(w.p.batch.rank, group, steps) for w in wave for group, steps in w.p.grads.groups]
        ),
    }
    claimed, watermarks, asked, late_ready, compiles_waiting = query(
        f"""
            WITH b AS (
              SELECT * FROM json_to_recordset(%(batches)s::json)
                AS b(session text, seq bigint, digest text, rank int, events int, host text, pid bigint, info json, step bigint,
                      progress json)
            ), {writes.claim_cte("b")},{tenancy_sql.ranks_seen_cte("b")}, {details.handout_cte()},{slots.grad_reports_ctes()},{slots.compiles_waiting_cte("b")}
            SELECT ARRAY(SELECT rank FROM claim),
                   {slots.watermarks_before()},
                   (SELECT COALESCE(json_object_agg(rank, steps), '{{}}') FROM (
                      SELECT rank, array_agg(DISTINCT step ORDER BY step) AS steps FROM asked GROUP BY rank) a),
                   ARRAY(SELECT id FROM late WHERE reported >= %(ws)s::int),
                   (SELECT due FROM waiting)
            """,
        params,
    )[0]
    claimed = set(claimed)
    for w in wave:
        rank = str(w.p.batch.rank)
        if w.p.batch.rank not in claimed:
            raise _Resent(w)
        w.before = watermarks.get(rank, {})
        w.asked = asked.get(rank, [])
    wave[0].ready += [(slots.GRAD, slot_id, run.id) for slot_id in late_ready]
    ended = [w for w in wave if protocol.RankEnd in w.p.by_type]
    gone = [e for w in wave for e in w.p.by_type.get(protocol.PeerGone, ())]
    wave[0].compiles_open |= compiles_waiting or bool(ended or gone)  # a rank that ended has passed every step
    _record_ends(run, ended)
    _record_gone(run, gone)


def _record_ends(run: Run, ended: list[_Written]) -> None:
    if not ended:
        return
    ends = [w.p.by_type[protocol.RankEnd][-1] for w in ended]
    query(
        tenancy_sql.RANK_ENDS,
        {
            "run": run.id,
            "rank": [w.p.batch.rank for w in ended],
            "status": [e.status for e in ends],
            "exit": [e.exit_code for e in ends],
        },
        rows=False,
    )


def _record_gone(run: Run, gone: list[protocol.PeerGone]) -> None:
    """Ranks their node's peers saw vanish: ended now, so rank_crashed pages at the next sweep."""
    if gone:
        query(
            tenancy_sql.RANKS_GONE,
            {"run": run.id, "rank": [e.rank for e in gone], "pid": [e.pid for e in gone]},
            rows=False,
        )


def _after_commit(written: list[_Written | None]) -> list[Stored]:
    """After the request committed: run liveness, the compile reports counted, then the grad slots
    every rank has now passed, and the compile slots (only where the batches left one open:
    `slots.compiles_passed`).

    Run liveness and the compile counts stay out of the batch transaction: every rank's batch
    touches these rows, so inside it their row locks would serialize all ingest of a run; liveness
    is skipped when nothing changes. Each is its own statement (its row locks are released at once,
    never held while other rows are locked; settling takes detection's advisory locks, never these
    rows: `dashboard.detection.locks`). Completed slots are looked for after commit, so of two ranks
    committing at once the later sees both (`dashboard.ledger.slots.grads_ready_sql`), in one
    statement per run for all of its batches.
    """
    runs: dict[int, list[_Written]] = {}
    for w in written:
        if w:
            runs.setdefault(w.run.id, []).append(w)
    for run_id, of_run in runs.items():
        _run_liveness(run_id, of_run)
        _count_compiles(of_run)
        of_run[0].ready += _grads_ready(of_run)
        if any(w.compiles_open for w in of_run):
            of_run[0].ready += slots.compiles_passed(of_run[0].run, _after_highest(of_run))
    return [_stored(w) if w else Stored(accepted=0, duplicate=True) for w in written]


def _grads_ready(written: list[_Written]) -> list[slots.Ready]:
    """Grad slots of one run that these batches' ranks completed. Each batch could only complete
    slots above its rank's old watermark, so per group the lowest of those floors bounds them all."""
    floors: dict[str, int] = {}
    for w in written:
        for group, _ in w.p.grads.groups:
            floor = w.before.get(group, -1)
            floors[group] = min(floors.get(group, floor), floor)
    if not floors:
        return []
    groups = sorted(floors)
    run = written[0].run
    rows = query(
        "WITH" + slots.grads_ready_sql(len(groups)) + " SELECT id FROM done",
        {
            "run": run.id,
            "ws": run.world_size,
            **slots.grads_ready_params(floors, groups, _after_highest(written)),
        },
    )
    return [(slots.GRAD, row[0], run.id) for row in rows]


def _after_highest(written: list[_Written]) -> int:
    """The rank after the highest of these batches' (a run's), where scans for a rank still behind
    begin: racks that report in rank order have the ranks still to come right after them."""
    return (max(w.p.batch.rank for w in written) + 1) % written[0].run.world_size


def _run_liveness(run_id: int, written: list[_Written]) -> None:
    steps = [w.p.last_step for w in written if w.p.last_step is not None]
    torch = next(
        (start.versions.get("torch", "") for w in written for start in w.p.by_type.get(protocol.RankStart, ())), ""
    )
    query(
        tenancy_sql.RUN_LIVENESS,
        {"run": run_id, "step": max(steps) if steps else None, "torch": torch},
        rows=False,
    )


def _stored(w: _Written) -> Stored:
    return Stored(
        accepted=len(w.p.batch.events),
        ready=w.ready,
        graph_hashes=w.p.graph_hashes,
        rank_steps=w.p.grads.rows,
        run_id=w.run.id,
        detail=w.asked,
    )


_PROGRESS = (protocol.Grad, protocol.Grads, protocol.Step, protocol.Param)


def _last_step(events: Sequence[protocol.Event]) -> int | None:
    """Last completed step: only progress events count (heartbeats carry the step in flight)."""
    steps = [
        e.step_numbers()[-1] if isinstance(e, protocol.Grads) else e.step for e in events if isinstance(e, _PROGRESS)
    ]
    return max(steps) if steps else None
