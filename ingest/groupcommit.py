"""Group commit: the ingest requests one process serves at the same moment share one transaction.

Why: agents flush every 0.5 s, so a request carries a few steps, and each paid a transaction of
its own: BEGIN, a COPY, the claim statement, COMMIT (a WAL flush), run liveness and the slot
completion statement, for 2 rank-steps. Sharing them, a group of N requests pays one COPY per
table, one claim statement per run and one commit, as a node relay's bulk request does.

How: leader and followers, no thread of its own. A request queues its job; when no group of this
process is being written, it leads: it takes the queued jobs (up to MAX_GROUP_BATCHES batches),
writes them with `writers.store_group` on its own database connection, hands every job its
outcome and wakes the others. Jobs that arrive while a group is written wait for it and form
the next one, so nobody waits on a timer: a lone request is written at once, and groups grow
with the load by themselves. A single-threaded caller (the test client, a management command)
always leads its own request.

What is kept: a request is answered only after the commit that holds its batches (followers
block until the leader has committed); each request is all or nothing and gets its own answer
(a duplicate, a 409, a 400 or a database error of one request leaves the others stored:
`writers.store_group`); durability is PostgreSQL's (synchronous_commit stays on).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from django.db import connection

from agents import protocol
from dashboard.tenancy.models import Project
from ingest import writers

MAX_GROUP_BATCHES = 256  # per transaction: bounds its locks, its statement sizes and a failing group's retry


@dataclass
class _Queued:
    job: writers.Job
    outcome: writers.Outcome | None = None


@dataclass
class _Committer:
    """The process's queue of jobs and whether a group is being written."""

    cv: threading.Condition = field(default_factory=threading.Condition)
    queue: list[_Queued] = field(default_factory=list)
    leading: bool = False

    def store(self, job: writers.Job) -> writers.Outcome:
        queued = _Queued(job)
        release_connection()
        with self.cv:
            self.queue.append(queued)
        while True:
            with self.cv:
                while queued.outcome is None and self.leading:
                    self.cv.wait()
                if queued.outcome is not None:
                    return queued.outcome
                self.leading = True
                group = self._take()
            self._write(group)

    def _take(self) -> list[_Queued]:
        group, batches = [], 0
        while self.queue and (not group or batches + len(self.queue[0].job.items) <= MAX_GROUP_BATCHES):
            batches += len(self.queue[0].job.items)
            group.append(self.queue.pop(0))
        return group

    def _write(self, group: list[_Queued]) -> None:
        outcomes: list = [RuntimeError("the group's writer was interrupted")] * len(group)
        try:
            outcomes = writers.store_group([q.job for q in group])
        except Exception as exc:  # after commit, or a bug: every request of the group hears it (a resend is a duplicate)
            outcomes = [exc] * len(group)
        finally:  # whatever happened, the followers are answered and the next leader may start
            with self.cv:
                for q, outcome in zip(group, outcomes):
                    q.outcome = outcome
                self.leading = False
                self.cv.notify_all()


_committer = _Committer()


def release_connection() -> None:
    """Give a pooled connection this thread holds (it looked a token up) back before it waits or idles:
    with more threads than pooled connections, a leader might otherwise find none."""
    if connection.connection is not None and not connection.in_atomic_block and connection.settings_dict["OPTIONS"].get("pool"):
        connection.close()


def store(project: Project, items: list[tuple[protocol.Batch, str]], bulk: bool = False) -> list[writers.Stored]:
    """Store one request's batches in this process's next group; raises what refused the request
    (a `Rejection`, or the database error that `views._guarded` answers as 422 or 503)."""
    outcome = _committer.store(writers.Job(project, items, bulk))
    if isinstance(outcome, Exception):
        raise outcome
    return outcome
