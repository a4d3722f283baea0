"""Group commit: the ingest requests one process serves at the same moment share one transaction.

Why: agents flush every 0.5 s, so a request carries a few steps, and each paid a transaction of
its own: BEGIN, a COPY, the claim statement, COMMIT (a WAL flush), run liveness and the slot
completion statement, for 2 rank-steps. Sharing them, a group of N requests pays one COPY per
table, one claim statement per run, one commit, one rate-limit count in Redis per project, one
blob lookup and one announcement of the slots it completed, as a node relay's bulk request does.

How: each of a process's `LOCKSTEP_INGEST_WRITERS` writer threads writes one group at a time,
and jobs that arrive while every writer is busy form the next group, so nobody waits on a timer: a
lone request is written at once, and groups grow with the load by themselves. Jobs queue on the
event loop (`LoopCommitter`, for the agents' door, `ingest.door`), a free writer thread writes the
oldest of them as a group (`write`), and the loop hands each request its answer. More than one
writer keeps PostgreSQL busy while a group waits for its commit or a row lock: a rack relay's
request is a group of its own (256 batches), and a step's burst of them queued behind one writer
per process while the database had cores to spare. Groups in flight at once meet only on rows
that other processes' groups meet on too (slots, a resent batch's claim): they wait on each other's
row locks, or lose a race and are tried again (`writers.store_group`).

What is kept: a request is answered only after the commit that holds its batches; each request is
all or nothing and gets its own answer (a duplicate, a 409, a 400, a 429, or a database error of
one request leaves the others stored: `writers.store_group`); durability is PostgreSQL's
(synchronous_commit stays on).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import msgspec
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, connections

from agents import protocol
from dashboard.ledger import details as ledger_details
from dashboard.ledger import flight as ledger_flight
from dashboard.ledger import signals as ledger
from ingest import backpressure, blobs, collector, metrics, ratelimit, writers
from ingest.refusals import Refusal

T = TypeVar("T")
MAX_GROUP_BATCHES = 256  # per transaction: bounds its locks, its statement sizes and a failing group's retry
COALESCE_AFTER = 8  # a group of this many batches means load: the next one waits COALESCE_S for company
COALESCE_S = 0.001

Answer = list[protocol.IngestReply] | Exception  # a request's reply per batch, or why it was refused


def write(jobs: list[writers.Job]) -> list[Answer]:
    """Count, store and answer one group: the rate limit (one Redis round trip per project), the
    batches (`writers.store_group`), then what the commit completed, announced once for the group."""
    answers: list[Answer | None] = list(_limited(jobs))
    admitted = [j for j, a in enumerate(answers) if a is None]
    outcomes = writers.store_group([jobs[j] for j in admitted]) if admitted else []
    stored = {j: o for j, o in zip(admitted, outcomes) if not isinstance(o, Exception)}
    for j, outcome in zip(admitted, outcomes):
        if isinstance(outcome, Exception):
            answers[j] = outcome
    ledger.announce_ready([slot for outcome in stored.values() for s in outcome for slot in s.ready])
    named: dict[tuple[int, int], list[str]] = {}  # the texts each project's run named: asked within its quotas
    for j, outcome in stored.items():
        for s in outcome:
            if s.graph_hashes and s.run_id is not None:
                named.setdefault((jobs[j].project.id, s.run_id), []).extend(s.graph_hashes)
    want = blobs.wanted(named)
    tally = _Tally()
    for j, outcome in stored.items():
        replies: list[protocol.IngestReply] = []
        for prepared, s in zip(jobs[j].prepared, outcome):
            replies.append(_reply(prepared, s, want))
            tally.add(prepared, s, "bulk" if jobs[j].bulk else "ingest")
        answers[j] = replies
    tally.publish()
    return cast(list[Answer], answers)  # each request limited, refused or answered above: none is None


def _limited(jobs: list[writers.Job]) -> list[Exception | None]:
    """Each request's rate-limit verdict (None: admitted), counting every batch, in arrival order:
    the requests past a project's LOCKSTEP_RATE_LIMIT in its one-second window get 429, and all of
    them 503 while Redis is unreachable (nothing is stored then)."""
    batches: Counter[int] = Counter()
    for job in jobs:
        batches[job.project.id] += len(job.items)
    try:
        counted = {pid: ratelimit.count(pid, n) - n for pid, n in batches.items()}  # the window before this group
    except ratelimit.BrokerDown as exc:
        return [exc] * len(jobs)
    limit = settings.LOCKSTEP_RATE_LIMIT
    verdicts: list[Exception | None] = []
    for job in jobs:
        counted[job.project.id] += len(job.items)
        over = 0 < limit < counted[job.project.id]
        verdicts.append(
            Refusal(429, f"project {job.project.name} exceeds {limit} batches/s; retry later") if over else None
        )
    return verdicts


def _reply(prepared: writers.Prepared, stored: writers.Stored, want: set[str]) -> protocol.IngestReply:
    """One batch's reply; each wanted graph text is asked of one batch only."""
    wanted = [h for h in stored.graph_hashes if h in want]
    want.difference_update(wanted)
    return protocol.IngestReply(
        accepted=stored.accepted,
        duplicate=stored.duplicate,
        want_blobs=wanted,
        detail=_details(prepared, stored),
        flight_recorder=True if ledger_flight.HANDOUT_STEP in (stored.detail or []) else msgspec.UNSET,
        weights_at=ledger_details.weights_steps(stored.detail or []) or msgspec.UNSET,
    )


def _details(prepared: writers.Prepared, stored: writers.Stored) -> list[int]:
    """Steps whose per-parameter fingerprints the server wants from this rank; answers in this
    batch may complete an alert's question, which is then explained in a task."""
    if stored.duplicate or stored.run_id is None:
        return []
    ledger.announce_details(stored.run_id, prepared.batch.rank, prepared.detail_steps)
    return [
        step for step in stored.detail or [] if step >= 0
    ]  # handed out in the batch's own statement (writers._claim)


@dataclass
class _Tally:
    """The group's accepted batches, events and rank-steps, added to /metrics once per group."""

    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    events: Counter[str | int | None] = field(default_factory=Counter)  # per wire tag
    rank_steps: int = 0
    steady: int = 0  # batches of the steady state (one `grads` event), counted without a Counter update each

    def add(self, prepared: writers.Prepared, stored: writers.Stored, endpoint: str) -> None:
        self.requests[(endpoint, "duplicate" if stored.duplicate else "accepted")] += 1
        if not stored.duplicate:
            if prepared.kinds is writers.ONE_GRADS:
                self.steady += 1
            else:
                self.events.update(prepared.kinds)
            self.rank_steps += stored.rank_steps

    def publish(self) -> None:
        if self.steady:
            self.events["grads"] += self.steady
        for (endpoint, outcome), n in self.requests.items():
            metrics.REQUESTS.labels(endpoint, outcome, "200").inc(n)
        for kind, n in self.events.items():
            metrics.EVENTS.labels(kind).inc(n)
        if self.rank_steps:
            metrics.RANK_STEPS.inc(self.rank_steps)


def with_interval(answer: Answer, arrived: float) -> Answer:
    """The replies with the flush interval the load calls for, once this request's time is observed."""
    backpressure.observe(time.monotonic() - arrived)
    if isinstance(answer, Exception):
        return answer
    interval = backpressure.flush_interval()
    return (
        answer if interval is msgspec.UNSET else [msgspec.structs.replace(r, flush_interval_s=interval) for r in answer]
    )


def _take(queue: list[T], batches_of: Callable[[T], int]) -> list[T]:
    """The oldest queued jobs, up to MAX_GROUP_BATCHES batches (always at least one)."""
    group: list[T] = []
    batches = 0
    while queue and (not group or batches + batches_of(queue[0]) <= MAX_GROUP_BATCHES):
        batches += batches_of(queue[0])
        group.append(queue.pop(0))
    return group


def _written(jobs: list[writers.Job]) -> list[Answer]:
    """`write`, with whatever escapes it (after commit, or a bug) as every request's answer: a resend is a duplicate."""
    try:
        return write(jobs)
    except Exception as exc:
        return [exc] * len(jobs)


def outside_request(work: Callable[..., T], *args: Any) -> T:
    """Run `work` on a thread outside any request (no request_finished tends its connection): a
    broken connection is closed, and the pooled one goes back at once."""
    try:
        return work(*args)
    finally:
        if not connection.in_atomic_block:  # (a test's transaction, when a test runs the door on its own thread)
            connection.close_if_unusable_or_obsolete()
        release_connection()


def release_connection() -> None:
    """Give a pooled connection this thread holds (it looked a token up) back before it waits or idles:
    with more threads than pooled connections, a leader might otherwise find none."""
    if (
        connection.connection is not None
        and not connection.in_atomic_block
        and connection.settings_dict["OPTIONS"].get("pool")
    ):
        connection.close()


class Pace:
    """Batches a second this process's writers get through, as their latest groups went: a moving
    average of each group's batches over its write time, times the writers (their groups overlap,
    and the contention between them is in each group's time). Why: how long a new request would
    wait is the batches queued ahead of it over this pace, and a bound in batches alone is a
    different wait on every host (`LoopCommitter.crowded`). A group counts by its size: a lone
    batch's group is mostly the statements every group pays, and says little of how fast a
    queue of them would go."""

    WEIGHT = 0.2  # of a full group (MAX_GROUP_BATCHES): about the last five such groups count

    def __init__(self, writers: int) -> None:
        self.writers = writers
        self.per_writer = 0.0  # batches a second of one writer's group (0: none written yet)

    def observe(self, batches: int, seconds: float) -> None:
        rate = batches / max(seconds, 1e-6)
        weight = self.WEIGHT * min(1.0, batches / MAX_GROUP_BATCHES)
        self.per_writer = rate if not self.per_writer else self.per_writer + (rate - self.per_writer) * weight

    def seconds_for(self, batches: int) -> float:
        """How long the writers would take for `batches` (unknown, infinite, until a group was written)."""
        return batches / (self.per_writer * self.writers) if self.per_writer else math.inf


@dataclass
class _Waiting:
    job: writers.Job
    arrived: float
    future: asyncio.Future[Answer]
    queued: float = field(default_factory=time.monotonic)


class LoopCommitter:
    """Group commit for requests served on the event loop: no thread per request, a few writer
    threads per process (`writers`, each an executor of one thread that keeps its own connection).
    The queue is also the process's load: a new request is refused at once when it would wait past
    its shedding point (`backpressure.SHED_AFTER_S`), by the oldest job's wait or by the batches
    ahead of it at the writers' pace, and the queue's length bounds the batches held in memory."""

    # a whole 16k-rank job's flush queues whatever the pace: agents flush at the same wall-clock
    # instants, so a burst of a job's batches is the normal case and must queue
    MIN_QUEUED_BATCHES = 16_384
    # the most held in memory (a steady batch about 1.5 KB of objects): past this a 503 at once
    MAX_QUEUED_BATCHES = 65_536
    # and in bytes of the queued requests' bodies, whatever their batches: large batches are large objects
    MAX_QUEUED_BYTES = 512 * 1024 * 1024

    def __init__(self, writers: list[Executor] | None = None) -> None:
        self.queue: list[_Waiting] = []
        self.queued_batches = 0
        self.queued_bytes = 0
        self.coalescing = False  # the next group waits COALESCE_S for the batches on their way
        self.young = collector.YoungGeneration(
            on_idle=self._idle
        )  # the collector's young generation, sized by the load
        self._writers = writers or [
            ThreadPoolExecutor(1, thread_name_prefix=f"lockstep-groupcommit-{i}")
            for i in range(settings.LOCKSTEP_INGEST_WRITERS)
        ]
        self._free = list(self._writers)  # the writers not writing a group now
        self.pace = Pace(len(self._writers))

    @property
    def writing(self) -> bool:
        """A group is being written."""
        return len(self._free) < len(self._writers)

    def oldest_wait(self) -> float:
        """Seconds the longest-waiting queued request has waited (0: none waits)."""
        return time.monotonic() - self.queue[0].arrived if self.queue else 0.0

    def crowded(self) -> str | None:
        """Why a new request would be refused at once (None: it is queued): the oldest queued one
        waited past its shedding point ("waited"), or the queue is full ("queue_full"): it holds what
        the writers take SHED_AFTER_S for at their pace, or MAX_QUEUED_BATCHES (never fewer than
        MIN_QUEUED_BATCHES), or MAX_QUEUED_BYTES of bodies. Why a pace: with a fixed count, a
        process that takes more batches a step than the count refused every step's last requests,
        though they would have been written well within the bound, and each one held its whole step
        back by a Retry-After (docs/scale-out.md, "A full queue is one that would wait past the bound")."""
        if self.oldest_wait() > backpressure.SHED_AFTER_S:
            return "waited"
        if self.queued_bytes >= self.MAX_QUEUED_BYTES or (
            self.queued_batches >= self.MIN_QUEUED_BATCHES
            and (
                self.queued_batches >= self.MAX_QUEUED_BATCHES
                or self.pace.seconds_for(self.queued_batches) > backpressure.SHED_AFTER_S
            )
        ):
            return "queue_full"
        return None

    async def store(self, job: writers.Job, arrived: float) -> Answer:
        """The request's answer, once the commit that holds it is done (or why it was refused)."""
        future = asyncio.get_running_loop().create_future()
        self.queue.append(_Waiting(job, arrived, future))
        self._count([job], 1)
        if self._free and not self.coalescing:
            self._next()
        return with_interval(await future, arrived)

    def _next(self) -> None:
        """Start writing the next group on a free writer (on the loop, which alone touches the queue)."""
        now = time.monotonic()
        while self.queue and now - self.queue[0].arrived > backpressure.SHED_AFTER_S:
            shed = self.queue.pop(0)  # it waited into its agent's timeout: refused unstored, resent after Retry-After
            self._count([shed.job], -1)
            metrics.SHED.labels("waited").inc()
            shed.future.set_result(
                Refusal(503, f"server overloaded (the batch waited {now - shed.arrived:.1f} s); retry later")
            )
        group = _take(self.queue, lambda w: len(w.job.items))
        if not group:
            return
        writer = self._free.pop()
        batches = self._count([w.job for w in group], -1)
        for waiting in group:
            metrics.QUEUED.observe(now - waiting.queued)
        metrics.GROUP_BATCHES.observe(batches)
        done = asyncio.get_running_loop().run_in_executor(
            writer, _write_on_thread, [w.job for w in group], bool(self.queue) or self.young.loaded
        )
        done.add_done_callback(lambda f: self._answer(group, batches, writer, f, now))

    def _count(self, jobs: list[writers.Job], sign: int) -> int:
        """Add (1) or take (-1) the jobs to or from the queue's counts; their batches."""
        batches = sum(len(job.items) for job in jobs)
        self.queued_batches += sign * batches
        self.queued_bytes += sign * sum(job.size for job in jobs)
        return batches

    def _answer(
        self,
        group: list[_Waiting],
        batches: int,
        writer: Executor,
        done: asyncio.Future[list[Answer]],
        began: float,
    ) -> None:
        took = time.monotonic() - began
        metrics.GROUP_WRITE.observe(took)
        self.pace.observe(batches, took)
        error = done.exception()  # `_written` answers what escapes `write`: a thread's Exception at most
        answers = done.result() if not error else [cast(Exception, error)] * len(group)
        for waiting, answer in zip(group, answers):
            if not waiting.future.done():  # its connection may have gone meanwhile
                waiting.future.set_result(answer)
        self._free.append(writer)
        # batches, not requests: a rack relay's one request of 256 batches is load (the collector's young
        # generation, the writer's connection kept), as 256 ranks posting at once are
        loaded = batches >= COALESCE_AFTER
        if loaded:
            self.young.busy()
        if loaded and not self.queue:
            # under load: the requests just answered send their next batches within a moment; a lone
            # early one would otherwise pay a whole group's statements and make the others wait for it
            self.coalescing = True
            asyncio.get_running_loop().call_later(COALESCE_S, self._next_if_idle)
        else:
            self._next()

    def _idle(self) -> None:
        """The process fell idle with its writers' pooled connections kept (`_write_on_thread`): they go
        back now (each after the group it is writing, if one is)."""
        for writer in self._writers:
            writer.submit(release_connection)

    def _next_if_idle(self) -> None:
        self.coalescing = False
        if self._free:
            self._next()

    def shutdown(self) -> None:
        """Close the writer threads' database connections, then stop them (tests)."""
        for writer in self._writers:
            writer.submit(connections.close_all).result()
            writer.shutdown(wait=True)


def _write_on_thread(jobs: list[writers.Job], keep: bool = False) -> list[Answer]:
    """On the writer thread. Without a pool it keeps its connection from group to group (checking
    it cost a round trip per group); with one it keeps it while groups follow one another (`keep`:
    jobs were left in the queue, or the process is loaded, when the queue runs dry between groups
    all the time) and gives it back otherwise; a loaded process gives it back once it falls idle
    (`LoopCommitter._idle`), so an idle process holds none and the pool never hands out one that
    died long ago. A connection
    lost since the last group (PostgreSQL restarted) fails the group: the requests it failed are
    written once more on a new connection, so a restart costs no agent a 503. Safe to repeat:
    what did commit answers as a duplicate."""
    try:
        answers = _written(jobs)
        lost = [j for j, answer in enumerate(answers) if _connection_lost(answer)]
        if lost:
            connection.close()
            for j, answer in zip(lost, _written([jobs[j] for j in lost])):
                answers[j] = answer
        return answers
    finally:
        if connection.errors_occurred and not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()
        if not keep:
            release_connection()


CONNECTION_LOST = {"57P01", "57P02", "57P03"}  # admin_shutdown, crash_shutdown, cannot_connect_now (and class 08)


def _connection_lost(answer: Answer) -> bool:
    """A database error that says the connection went away, not that a statement failed (a timeout,
    a refused value): the connection's failure, or no SQLSTATE at all (the socket closed)."""
    if not isinstance(answer, (OperationalError, InterfaceError)):
        return False
    sqlstate = getattr(answer.__cause__, "sqlstate", None)
    return sqlstate is None or sqlstate.startswith("08") or sqlstate in CONNECTION_LOST
