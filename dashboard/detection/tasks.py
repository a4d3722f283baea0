"""Celery tasks: settle slots the moment they are complete, name the parameters behind a
divergence, compare against a baseline, and a periodic sweep for what timed out or was left
behind (overdue slots, silent ranks). Alerts that changed are announced (`signals.alerts_changed`);
delivery takes it from there.

Tasks are idempotent (keyed by slot / alert revision) and acknowledged late; the state they act
on lives in PostgreSQL, so a worker killed mid-task, or a lost broker message, is made good by the
next sweep and yields each alert exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from celery import shared_task
from django.db import InterfaceError, OperationalError, transaction

from dashboard.detection import baseline, bills, detail, fairness, flight, runs, settle, sweep_clock
from dashboard.detection.models import Baseline
from dashboard.detection.signals import announce
from dashboard.ledger import slots
from dashboard.ledger.models import CompileSlot, GradSlot
from dashboard.tenancy.models import Run

if TYPE_CHECKING:
    from django.contrib.auth.models import User

SETTLERS = {slots.COMPILE: settle.settle_compile, slots.GRAD: settle.settle_grad}
SETTLE_CHUNK = 32  # slots per message: one publish per chunk instead of per slot, chunks spread over workers

log = logging.getLogger(__name__)


TRANSIENT = (OperationalError, InterfaceError)  # the database was away or a lock timed out: the sweep retries


def settle_one(kind: str, slot_id: int) -> list[int]:
    """Settle one slot; one whose settle raises is quarantined (`slots.quarantine`) and logged, so it
    never stops the other slots of its message, its run or the sweep. A transient failure (database
    unreachable, lock timeout) is left to the sweep."""
    try:
        return SETTLERS[kind](slot_id)
    except TRANSIENT:
        log.warning("settling %s slot %d failed; the sweep tries again", kind, slot_id, exc_info=True)
    except Exception:
        run_id = slots.quarantine(kind, slot_id)
        log.exception("settling %s slot %d of run %s raised: quarantined", kind, slot_id, run_id)
    return []


@shared_task(acks_late=True, ignore_result=True)
def settle_slot(kind: str, slot_id: int) -> int:
    changed = settle_one(kind, slot_id)
    announce(changed)
    return len(changed)


@shared_task(acks_late=True, ignore_result=True)
def settle_slots(kind: str, slot_ids: list[int], run_id: int | None = None) -> int:
    """Settle the slots one batch completed (the last rank of a 256-step batch completes 256 at once),
    all of one run (`run_id`, whose queued count they leave: `fairness`). Each slot's alerts are
    announced as it commits: a page does not wait for the rest of its message."""
    changed = 0
    try:
        for slot_id in slot_ids:
            alert_ids = settle_one(kind, slot_id)
            announce(alert_ids)
            changed += len(alert_ids)
    finally:
        if run_id is not None:
            fairness.release(run_id, len(slot_ids))
    return changed


SWEEP_EXPIRES_S = 10.0  # a sweep's settle message not started by then is dropped: the next sweep queues it again


def queue_settles(ready: list[slots.Ready], expires: float | None = None) -> None:
    """Queue settling of complete slots, a chunk of one run per message, at the priority its run's
    backlog earns (`fairness`); `expires`: the sweep's copies, which must not pile up in the broker
    while the workers are down (the state is in PostgreSQL)."""
    by_run: dict[tuple[str, int], list[int]] = {}
    for kind, slot_id, run_id in ready:
        by_run.setdefault((kind, run_id), []).append(slot_id)
    for (kind, run_id), ids in by_run.items():
        start, size = 0, SETTLE_CHUNK
        while start < len(ids):
            chunk = ids[start : start + size]
            priority = fairness.claim(run_id, len(chunk))
            if priority > fairness.TOP and len(chunk) > fairness.BACKLOG_CHUNK:  # behind its own run's backlog: short
                fairness.release(run_id, len(chunk) - fairness.BACKLOG_CHUNK)  # messages, so others pass soon
                chunk, size = chunk[: fairness.BACKLOG_CHUNK], fairness.BACKLOG_CHUNK
            start += len(chunk)
            settle_slots.apply_async((kind, chunk, run_id), expires=expires, priority=priority)  # type: ignore[arg-type]  # None: no expiry; celery's stubs leave None out


@shared_task(acks_late=True, ignore_result=True)
def keep_bills(run_ids: list[int]) -> int:
    """Keep the compile bills of runs no sweep billed (a reader computed one in memory, the project's
    cost page found some missing): readers never write, the worker does (`bills.fresh_bill`)."""
    runs = list(Run.objects.filter(id__in=run_ids).select_related("project"))
    for run in runs:
        bills.fresh_bill(run)
    return len(runs)


@shared_task(acks_late=True, ignore_result=True)
def explain(alert_id: int) -> bool:
    """All asked ranks answered: name the differing parameters in the alert, then deliver it."""
    changed = detail.explain(alert_id)
    if changed:
        announce([alert_id])
    return changed


@shared_task(acks_late=True, ignore_result=True)
def compare_baseline(run_id: int) -> int:
    run = Run.objects.filter(id=run_id).first()
    changed = baseline.compare(run) if run else []
    announce(changed)
    return len(changed)


def choose_baseline(run: Run, base: Run, user: User | None = None) -> Baseline:
    """Make `base` the baseline of `run`; the comparison over settled steps runs after commit."""
    with transaction.atomic():
        link = baseline.choose(run, base, user)
        transaction.on_commit(lambda: compare_baseline.delay(run.id))
    return link


@shared_task(ignore_result=True)
def sweep() -> int:
    """Every 2 s (beat): settle overdue slots, check active runs; then mark it completed (`sweep_clock`)."""
    due = [(slots.COMPILE, i, run) for i, run in slots.overdue(CompileSlot).items()]
    due += [(slots.GRAD, i, run) for i, run in slots.overdue(GradSlot).items()]
    queue_settles(due, expires=SWEEP_EXPIRES_S)
    active = runs.active_runs()
    for run in active:
        changed = each_run(runs.check, run)
        announce(changed)
        for alert_id, revision in runs.ask_flight_records(run, changed):
            summarize_flight_records.apply_async((alert_id, revision), countdown=flight.wait_s())
    checked = {run.id for run in active}
    for run in runs.just_ended():
        if run.id not in checked:
            announce(each_run(runs.check_ended, run))
    sweep_clock.mark()
    return len(due)


def each_run(check: Callable[[Run], list[int]], run: Run) -> list[int]:
    """One run's periodic check; one that raises is logged and tried again by the next sweep, never
    stopping the other runs' checks (one run's data must not silence every project)."""
    try:
        return check(run)
    except Exception:
        log.exception("checking run %s raised; the sweep goes on with the other runs", run.id)
        return []


@shared_task(acks_late=True, ignore_result=True)
def summarize_flight_records(alert_id: int, revision: int) -> bool:
    """The ranks' Flight Recorder dumps are in (or the wait is over): torch's analysis into the alert."""
    changed = flight.summarize(alert_id, revision)
    if changed:
        announce([alert_id])
    return changed


def on_slots_ready(sender: object, ready: list[slots.Ready], **kwargs: object) -> None:
    """ledger.signals.slots_ready: settle now; if the broker is down, the sweep settles them later."""
    try:
        queue_settles(ready)
    except Exception:
        log.warning("broker unavailable; %d slots left to the sweep", len(ready), exc_info=True)


def on_details_received(sender: object, run_id: int, rank: int, steps: set[int], **kwargs: object) -> None:
    """ledger.signals.details_received: answers may complete an alert's question, explained in a task."""
    for alert_id in detail.answered(run_id, rank, steps):
        explain.delay(alert_id)


def on_flight_record(sender: object, run_id: int, rank: int, asked: list[tuple[int, int]], **kwargs: object) -> None:
    """ledger.signals.flight_records_received: a round whose ranks all answered is analysed now."""
    from dashboard.ledger import flight as ledger_flight

    for alert_id, revision in asked:
        if all(r.answered_at for r in ledger_flight.requests(alert_id, revision)):
            summarize_flight_records.delay(alert_id, revision)
