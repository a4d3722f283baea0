"""Slots settle into consensus and alerts through the real writers and PostgreSQL (in-process)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.detection import settle
from dashboard.detection.models import Alert
from dashboard.ledger import slots
from dashboard.ledger.models import CompileSlot, GradSlot
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

REASON = "size mismatch at index 0. expected 16, actual 17"


def grad(step, fps):
    return {"t": "grad", "step": step, "fps": fps}


def send(post, rank, seq, events, world_size=3):
    response = post(make_batch(rank=rank, seq=seq, events=events, world_size=world_size))
    assert response.status_code == 200, response.content


def test_grad_slot_settles_with_the_dissenter(post):
    for rank in range(3):
        send(post, rank, 0, [grad(0, [1, 2]), grad(1, [3, 4] if rank != 1 else [3, 5])])
    for slot in GradSlot.objects.order_by("step"):
        assert slot.reported == 3
        settle.settle_grad(slot.id)
    clean, bad = GradSlot.objects.order_by("step")
    assert clean.dissenters == [] and bad.dissenters == [1]
    alert = Alert.objects.get()
    assert (alert.kind, alert.ranks, alert.step, alert.details["buckets"]) == ("grad_divergence", [1], 1, [1])


def test_a_rank_that_reported_a_step_twice_is_compared_by_its_later_report(post):
    """Rank 2 reports the step otherwise, then again alike with ranks 0 and 1 (a later batch): the slot
    is compared rank by rank, its later report counts, and nobody dissents (counted as stored, rank
    2's first row would have made it a dissenter)."""
    send(post, 2, 0, [grad(0, [8])])
    send(post, 0, 0, [grad(0, [7])])
    send(post, 1, 0, [grad(0, [7])])
    send(post, 2, 1, [grad(0, [7])])
    slot = GradSlot.objects.get()
    settle.settle_grad(slot.id)
    slot.refresh_from_db()
    assert slot.dissenters == [] and not Alert.objects.exists()


def test_settling_twice_is_a_no_op(post):
    for rank in range(3):
        send(post, rank, 0, [grad(0, [1 if rank else 2])])
    slot = GradSlot.objects.get()
    assert len(settle.settle_grad(slot.id)) == 1
    assert settle.settle_grad(slot.id) == []
    assert Alert.objects.get().count == 1


def test_one_desync_over_many_steps_is_one_alert(post):
    for rank in range(3):
        send(post, rank, 0, [grad(s, [s + (rank == 2)]) for s in range(4)])
    fresh = [a for slot in GradSlot.objects.order_by("step") for a in settle.settle_grad(slot.id)]
    alert = Alert.objects.get()
    assert len(fresh) == 1  # notified once; later steps only count
    assert (alert.step, alert.count, alert.ranks) == (0, 4, [2])


def test_local_groups_whose_gradients_never_agreed_are_never_compared(post):
    for rank in range(3):
        send(post, rank, 0, [{"t": "grad", "step": 0, "group": "local", "fps": [rank], "norm": 1.0}])
    slot = GradSlot.objects.get()
    assert settle.settle_grad(slot.id) == []
    slot.refresh_from_db()
    assert slot.settled_at is not None and slot.dissenters == [] and not Alert.objects.exists()


def test_recompile_on_one_rank_settles_after_the_timeout(post, settings):
    compile0 = {"t": "compile", "frame": "train.py:1:forward", "index": 0, "step": 0}
    for rank in range(3):
        send(post, rank, 0, [compile0, grad(0, [1])])
    send(post, 1, 1, [{**compile0, "index": 1, "step": 4, "recompile_reason": REASON}])
    slot = CompileSlot.objects.get(index=1)
    settle.settle_compile(slot.id)  # ranks 0 and 2 are still before step 4: not judged yet
    assert CompileSlot.objects.get(index=1).pending and not Alert.objects.exists()
    for rank in (0, 2):
        send(post, rank, 1, [grad(s, [1]) for s in range(1, 6)])
    slot = CompileSlot.objects.get(index=1)
    assert slot.reported == 1
    assert slot.id not in slots.overdue(CompileSlot)
    later = timezone.now() + timedelta(seconds=settings.LOCKSTEP_SETTLE_TIMEOUT + 1)
    assert slot.id in slots.overdue(CompileSlot, now=later)
    settle.settle_compile(slot.id)
    alert = Alert.objects.get(kind="recompile_divergence")
    assert (alert.ranks, alert.step, alert.frame) == ([1], 4, "train.py:1:forward")
    assert REASON in alert.message


def test_late_report_reopens_the_slot(post):
    send(post, 0, 0, [grad(0, [1])])
    slot = GradSlot.objects.get()
    settle.settle_grad(slot.id)
    slot.refresh_from_db()
    assert not slot.pending
    send(post, 1, 0, [grad(0, [2])])
    slot.refresh_from_db()
    assert slot.pending
    settle.settle_grad(slot.id)
    assert Alert.objects.get().ranks == [0, 1]  # two ranks that differ: no majority, both named


def test_weight_fingerprints_settle_as_param_slots(post):
    for rank in range(3):
        send(
            post,
            rank,
            0,
            [
                {"t": "param", "step": 50, "fps": [1, 2 if rank != 0 else 3]},
                {"t": "param", "step": 0, "group": "local", "fps": [rank]},
            ],
        )
    slot, local = GradSlot.objects.order_by("group")
    assert (slot.group, slot.step, slot.reported) == ("param:ddp", 50, 3)
    assert local.group == "param:local"  # never compared: no gradient showed these ranks are replicas
    settle.settle_grad(slot.id)
    settle.settle_grad(local.id)
    alert = Alert.objects.get()
    assert (alert.kind, alert.ranks, alert.step) == ("param_divergence", [0], 50)


def test_grad_divergence_asks_for_and_names_the_parameters(post):
    layout = {
        "t": "rank_start",
        "params": ["ddp:net.0.weight", "ddp:net.0.bias", "ddp:net.2.weight", "local:head.w"],
        "buckets": [[0, 1], [2], [3]],
    }
    for rank in range(3):
        send(post, rank, 0, ([layout] if rank == 0 else []) + [grad(2, [5, 6 if rank == 1 else 7])])
    settle.settle_grad(GradSlot.objects.get().id)
    alert = Alert.objects.get()
    assert alert.details["buckets"] == [1]
    assert alert.details["bucket_params"] == {"1": ["net.2.weight"]}  # from rank 0's layout, before any answer
    asked = [post(make_batch(rank=r, seq=1, events=[{"t": "heartbeat"}])).json()["detail"] for r in range(3)]
    assert asked == [[2], [2], []]  # the dissenter and the reference rank, nobody else
    assert post(make_batch(rank=1, seq=2, events=[{"t": "heartbeat"}])).json()["detail"] == []  # asked once
    params = {"net.0.weight": 11, "net.0.bias": 12, "net.2.weight": 13}
    for rank, seq in ((0, 2), (1, 3)):
        mine = dict(params, **({"net.2.weight": 99} if rank == 1 else {}))
        assert (
            post(make_batch(rank=rank, seq=seq, events=[{"t": "detail", "step": 2, "params": mine}])).status_code == 200
        )
    from dashboard.detection import detail

    assert detail.explain(alert.id)
    alert.refresh_from_db()
    assert alert.details["params"] == ["net.2.weight"]
    assert alert.message.endswith("parameters: net.2.weight")
    assert not detail.explain(alert.id)  # explained once


def test_nan_on_every_rank_is_rooted_at_the_rank_whose_loss_went_non_finite_first(post):
    """Rank 2's loss turned inf at step 1; the all-reduce spread NaN to every rank's gradients."""
    for rank in range(3):
        losses = [{"t": "step", "step": s, "loss": 0.5} for s in (0, 1) if not (rank == 2 and s == 1)]
        losses += [{"t": "step", "step": 1, "nonfinite_loss": True}] if rank == 2 else []
        send(post, rank, 0, [*losses, {**grad(1, [7]), "nonfinite": 4}])
    settle.settle_grad(GradSlot.objects.get().id)
    alert = Alert.objects.get()
    assert (alert.kind, alert.ranks, alert.step, alert.details["loss_first"]) == (
        "nonfinite_grad",
        [2],
        1,
        {"rank": 2, "step": 1},
    )
    assert alert.message.startswith("Gradients non-finite on all ranks from step 1: rank 2's loss went non-finite")


def test_a_slots_alerts_are_announced_before_the_next_slot_of_its_message_settles(post):
    """A settle message holds up to 32 slots (a batch of many steps completes them at once): the page
    of the first must not wait for the others' settles."""
    from dashboard.detection import signals, tasks

    for rank in range(3):  # rank 1 differs at step 0; step 1 agrees
        send(post, rank, 0, [grad(0, [1, 2 + (rank == 1)]), grad(1, [3, 4])])
    first, second = GradSlot.objects.order_by("step").values_list("id", flat=True)
    seen: list[tuple[list[int], bool]] = []

    def heard(sender, alert_ids, **kwargs):
        seen.append((alert_ids, GradSlot.objects.get(id=second).settled_at is not None))

    signals.alerts_changed.connect(heard, dispatch_uid="test-heard")
    try:
        tasks.settle_slots(slots.GRAD, [first, second])
    finally:
        signals.alerts_changed.disconnect(dispatch_uid="test-heard")
    assert seen == [([Alert.objects.get(kind="grad_divergence").id], False)]
