"""Celery tasks: settle slots the moment they are complete, deliver alert revisions, and a
periodic sweep for what timed out or was left behind (overdue slots, pending deliveries,
silent ranks).

Tasks are idempotent (keyed by slot / alert revision / notification) and acknowledged late;
the state they act on lives in PostgreSQL, so a worker killed mid-task, or a lost broker
message, is made good by the next sweep and yields each alert exactly once.
"""
from __future__ import annotations

from celery import shared_task

from dashboard.delivery import notify, webhooks
from dashboard.detection import baseline, detail, runs, settle, slots
from dashboard.models import CompileSlot, GradSlot

SETTLERS = {slots.COMPILE: settle.settle_compile, slots.GRAD: settle.settle_grad}
SETTLE_CHUNK = 32  # slots per message: one publish per chunk instead of per slot, chunks spread over workers
RETRY_BACKOFF_MAX_S = 300


@shared_task(acks_late=True, ignore_result=True)
def settle_slot(kind: str, slot_id: int) -> int:
    changed = SETTLERS[kind](slot_id)
    for alert_id in changed:
        deliver.delay(alert_id)
    return len(changed)


@shared_task(acks_late=True, ignore_result=True)
def settle_slots(kind: str, slot_ids: list[int]) -> int:
    """Settle the slots one batch completed (the last rank of a 256-step batch completes 256 at once)."""
    changed = [alert_id for slot_id in slot_ids for alert_id in SETTLERS[kind](slot_id)]
    for alert_id in dict.fromkeys(changed):
        deliver.delay(alert_id)
    return len(changed)


def queue_settles(ready: list[tuple[str, int]]) -> None:
    """Queue settling of complete slots, a chunk per message."""
    by_kind: dict[str, list[int]] = {}
    for kind, slot_id in ready:
        by_kind.setdefault(kind, []).append(slot_id)
    for kind, ids in by_kind.items():
        for i in range(0, len(ids), SETTLE_CHUNK):
            settle_slots.delay(kind, ids[i:i + SETTLE_CHUNK])


@shared_task(acks_late=True, ignore_result=True)
def deliver(alert_id: int) -> int:
    notes = notify.deliver(alert_id)
    for note_id in notes:
        send_webhook.delay(note_id)
    return len(notes)


@shared_task(bind=True, acks_late=True, ignore_result=True, max_retries=10)
def send_webhook(self, notification_id: int) -> None:
    try:
        webhooks.send(notification_id)
    except Exception as exc:
        raise self.retry(exc=exc, countdown=min(2 ** self.request.retries, RETRY_BACKOFF_MAX_S))


@shared_task(acks_late=True, ignore_result=True)
def explain(alert_id: int) -> bool:
    """All asked ranks answered: name the differing parameters in the alert, then deliver it."""
    changed = detail.explain(alert_id)
    if changed:
        deliver.delay(alert_id)
    return changed


@shared_task(acks_late=True, ignore_result=True)
def compare_baseline(run_id: int) -> int:
    from ingest.models import Run

    run = Run.objects.filter(id=run_id).first()
    changed = baseline.compare(run) if run else []
    for alert_id in changed:
        deliver.delay(alert_id)
    return len(changed)


@shared_task(ignore_result=True)
def sweep() -> int:
    """Every 2 s (beat): settle overdue slots, re-deliver pending alerts, check active runs."""
    due = [(slots.COMPILE, i) for i in slots.overdue(CompileSlot)] + [(slots.GRAD, i) for i in slots.overdue(GradSlot)]
    for kind, slot_id in due:
        settle_slot.delay(kind, slot_id)
    for run in runs.active_runs():
        for alert_id in runs.check(run):
            deliver.delay(alert_id)
        notify.push_progress(run, runs.rank_rows(run))
    for alert_id in notify.pending():
        deliver.delay(alert_id)
    return len(due)
