"""Celery tasks: settle slots the moment they are complete, and sweep the overdue ones.

Tasks are idempotent (keyed by slot) and acknowledged late, so a worker killed mid-task
leaves the message to be redelivered and the slot settles exactly once.
"""
from __future__ import annotations

from celery import shared_task

from dashboard.detection import settle, slots
from dashboard.models import CompileSlot, GradSlot

SETTLERS = {slots.COMPILE: settle.settle_compile, slots.GRAD: settle.settle_grad}


@shared_task(acks_late=True, ignore_result=True)
def settle_slot(kind: str, slot_id: int) -> int:
    return len(SETTLERS[kind](slot_id))


@shared_task(ignore_result=True)
def sweep() -> int:
    """Settle slots whose timeout passed without every rank reporting (beat, every 2 s)."""
    due = [(slots.COMPILE, i) for i in slots.overdue(CompileSlot)] + [(slots.GRAD, i) for i in slots.overdue(GradSlot)]
    for kind, slot_id in due:
        settle_slot.delay(kind, slot_id)
    return len(due)
