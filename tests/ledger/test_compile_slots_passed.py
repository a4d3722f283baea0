"""A compile slot some ranks never report is complete once every rank has reported progress past its
step: the batch that shows it announces the slot ready, no settle timeout waited for (through the
real door, writers and PostgreSQL, in-process)."""

from __future__ import annotations

import pytest

from dashboard.detection import settle
from dashboard.detection.models import Alert
from dashboard.ledger.models import CompileSlot
from dashboard.ledger.signals import slots_ready

pytestmark = pytest.mark.django_db

FRAME = "train.py:1:forward"
REASON = "size mismatch at index 0. expected 16, actual 17"


def compile_(index: int, step: int, **extra) -> dict:
    return {"t": "compile", "frame": FRAME, "index": index, "step": step, **extra}


def step(n: int) -> dict:
    return {"t": "step", "step": n}


@pytest.fixture
def announced():
    """The compile slots ingest announced ready, in order."""
    seen: list[int] = []

    def receiver(sender, ready, **kwargs):
        seen.extend(slot_id for kind, slot_id, _ in ready if kind == "compile")

    slots_ready.connect(receiver, dispatch_uid="test-compile-slots-passed")
    yield seen
    slots_ready.disconnect(dispatch_uid="test-compile-slots-passed")


def test_a_rank_that_recompiled_alone_is_ready_once_every_rank_passed_its_step(send, announced):
    for rank in range(3):
        send(rank, compile_(0, 0), step(0))
    send(1, compile_(1, 4, recompile_reason=REASON), step(4), step(5))
    slot = CompileSlot.objects.get(index=1)
    assert slot.step == 4
    send(0, step(4))
    send(2, step(4))  # at step 4 still: a compile of step 4 could follow a loss it logged before stepping
    assert slot.id not in announced
    send(0, step(5))
    assert slot.id not in announced  # rank 2 has not passed it yet
    send(2, step(5))
    assert announced == [CompileSlot.objects.get(index=0).id, slot.id]
    settle.settle_compile(slot.id)
    alert = Alert.objects.get(kind="recompile_divergence")
    assert (alert.ranks, alert.step) == ([1], 4)


def test_a_compile_flushed_after_its_steps_progress_is_no_dissent(send, announced):
    """A rank's compile of step 4 in a later batch than its step-4 loss: counted, never a dissenter."""
    for rank in range(3):
        send(rank, compile_(0, 0), step(0))
    send(0, compile_(1, 4), step(4), step(5))
    send(1, compile_(1, 4), step(4), step(5))
    send(2, {"t": "step", "step": 4, "loss": 1.5})
    [first] = announced
    send(2, compile_(1, 4), step(4), step(5))
    slot = CompileSlot.objects.get(index=1)
    assert (slot.reported, announced) == (3, [first, slot.id])
    assert settle.settle_compile(slot.id) == [] and not Alert.objects.exists()


def test_a_rank_that_ended_has_passed_every_step(send, announced):
    for rank in range(3):
        send(rank, compile_(0, 0), step(0))
    send(1, compile_(1, 3), step(3), step(4))
    send(0, step(4))
    send(2, step(2), {"t": "rank_end", "status": "ok"})
    assert CompileSlot.objects.get(index=1).id in announced
