"""A settle in progress never holds what ingest writes: the run's row and the slot's row stay free,
so the ranks' batches go on being accepted while a large slot is compared (`dashboard.detection.locks`)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from dashboard.detection import runs, settle
from dashboard.detection.models import Alert
from dashboard.ledger.models import GradSlot
from dashboard.tenancy.models import Run
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db(transaction=True)


def grads(post, rank: int, step: int, fps: int = 0) -> None:
    batch = make_batch(
        run="locks", rank=rank, seq=step, events=[{"t": "grad", "step": step, "fps": [step, fps]}], world_size=3
    )
    response = post(dict(batch, session=f"settle-locks-{rank}"))
    assert response.status_code == 200, response.content


def paused_settle(monkeypatch, slot_id: int) -> tuple[threading.Thread, threading.Event, threading.Event]:
    """settle_grad of `slot_id` in a thread of its own, held just after it read the slot's reports."""
    inside, release = threading.Event(), threading.Event()
    read = settle.reads.grad_reports

    def held(*args):
        reports = read(*args)
        inside.set()
        release.wait(20)
        return reports

    monkeypatch.setattr(settle.reads, "grad_reports", held)

    def run() -> None:
        try:
            settle.settle_grad(slot_id)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    assert inside.wait(20)
    return thread, inside, release


def test_ranks_report_while_their_slot_settles_and_a_late_report_leaves_it_pending(post, monkeypatch):
    grads(post, 0, 0)
    grads(post, 1, 0)
    slot = GradSlot.objects.get(run__key="locks", step=0)
    thread, _, release = paused_settle(monkeypatch, slot.id)
    try:
        grads(post, 2, 0, fps=7)  # the same slot's row and the run's row, while the settle holds its locks
        grads(post, 0, 1)
        assert thread.is_alive()  # accepted while the settle still ran, not after it let go
    finally:
        release.set()
        thread.join(20)
    slot.refresh_from_db()
    assert slot.settled_at is not None and slot.settled_n == 2 and slot.reported == 3
    assert slot.pending  # rank 2's report came after the settle read the slot: it is compared again
    assert not Alert.objects.filter(run__key="locks").exists()
    monkeypatch.undo()
    settle.settle_grad(slot.id)
    slot.refresh_from_db()
    assert not slot.pending and slot.settled_n == 3
    alert = Alert.objects.get(run__key="locks", kind="grad_divergence")
    assert alert.ranks == [2] and alert.incident_id is not None


def test_a_sweep_skips_a_run_whose_last_check_still_runs(post, monkeypatch):
    grads(post, 0, 0)
    run = Run.objects.get(key="locks")
    inside, release = threading.Event(), threading.Event()
    view_of = runs.view_of
    looks: list[str] = []

    def held(*args):
        looks.append(threading.current_thread().name)
        view = view_of(*args)
        if len(looks) == 1:
            inside.set()
            release.wait(20)
        return view

    monkeypatch.setattr(runs, "view_of", held)

    def check() -> None:
        try:
            runs.check(run)
        finally:
            connection.close()

    first = threading.Thread(target=check, name="first")
    first.start()
    try:
        assert inside.wait(20)
        second = threading.Thread(target=check, name="second")
        second.start()
        second.join(20)
        assert not second.is_alive() and first.is_alive()
        assert looks == ["first"]  # the overlapping check skipped the run: it never read its ranks
    finally:
        release.set()
        first.join(20)
    runs.check(run)
    assert looks == ["first", "MainThread"]  # once the first is done, the next sweep checks it
