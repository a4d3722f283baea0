"""The compact `grads` form: stored exactly like the `grad` list form, counted per rank-step, settled."""

from __future__ import annotations

import base64

import pytest

from agents import protocol
from dashboard.detection import settle
from dashboard.detection.models import Alert
from dashboard.evidence.models import GradReport
from dashboard.ledger.models import GradSlot
from dashboard.tenancy.models import Rank, Run
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db
U64 = (1 << 64) - 1


def grads(step: int, rows: list[list[int]], **extra) -> dict:
    return protocol.msgspec.to_builtins(protocol.Grads.pack(step, rows, **extra))


def test_grads_rows_equal_the_list_form(post):
    rows = [[1, U64, 7], [3, 4, 1 << 63]]
    listed = [{"t": "grad", "step": 10 + i, "fps": r} for i, r in enumerate(rows)]
    assert post(make_batch(run="list", events=listed)).status_code == 200
    response = post(make_batch(run="packed", events=[grads(10, rows, norms=[0.5, 1.5], nonfinite=[0, 2])]))
    assert response.status_code == 200, response.content
    assert response.json()["accepted"] == 1
    stored = {
        key: [(g.step, g.fps) for g in GradReport.objects.filter(run__key=key).order_by("step")]
        for key in ("list", "packed")
    }
    assert stored["list"] == stored["packed"] == [(10, [1, -1, 7]), (11, [3, 4, -(1 << 63)])]
    packed = GradReport.objects.filter(run__key="packed").order_by("step")
    assert [(g.norm, g.nonfinite) for g in packed] == [(0.5, 0), (1.5, 2)]
    assert Run.objects.get(key="packed").last_step == 11
    assert Rank.objects.get(run__key="packed").last_step == 11


@pytest.mark.parametrize(
    "mutate, path",
    [
        (lambda e: e.update(fps=e["fps"][:-4]), "events[0]"),  # not 8 * steps * buckets bytes
        (lambda e: e.update(fps="not base64!"), "events[0].fps"),
        (lambda e: e.update(norms=[1.0]), "events[0]"),
        (lambda e: e.update(buckets=0), "events[0].buckets"),
        (lambda e: e.update(steps=protocol.MAX_GRADS_STEPS + 1), "events[0].steps"),
        (lambda e: e.update(group="g" * 65), "events[0].group"),
        (lambda e: e.update(step=1 << 62, stride=7), "events[0].steps"),
    ],
)
def test_bad_grads_is_400_and_stores_nothing(post, mutate, path):
    event = grads(0, [[1, 2], [3, 4]])
    mutate(event)
    response = post(make_batch(events=[event]))
    assert response.status_code == 400, response.content
    assert response.json()["path"] == path
    assert not GradReport.objects.exists() and not Run.objects.exists()


def test_slots_fill_by_watermark_and_settle_with_the_dissenter(post):
    for rank in range(3):
        rows = [[s, s + 1] for s in range(4)]
        if rank == 2:
            rows[3] = [99, 99]
        assert post(make_batch(rank=rank, events=[grads(0, rows)])).status_code == 200
    slots = list(GradSlot.objects.order_by("step"))
    assert [s.step for s in slots] == [0, 1, 2, 3]
    assert all(s.reported == 3 for s in slots)  # complete: every rank's watermark passed them
    for slot in slots:
        settle.settle_grad(slot.id)
    alert = Alert.objects.get()
    assert (alert.kind, alert.ranks, alert.step) == ("grad_divergence", [2], 3)


def test_slots_wait_for_the_slowest_rank(post):
    post(make_batch(rank=0, events=[grads(0, [[1]] * 4)]))
    post(make_batch(rank=1, events=[grads(0, [[1]] * 4)]))
    post(make_batch(rank=2, events=[grads(0, [[1]] * 2)]))
    assert [s.reported for s in GradSlot.objects.order_by("step")] == [3, 3, 1, 1]
    post(make_batch(rank=2, seq=1, events=[grads(2, [[1]] * 2)]))
    assert [s.reported for s in GradSlot.objects.order_by("step")] == [3, 3, 3, 3]


def test_a_rank_yet_to_report_holds_the_slots_whoever_reported_around_it(post):
    """A gap in the ranks (rank 1 silent so far) ends the completeness scan at once, as a rank below does."""
    post(make_batch(rank=0, events=[grads(0, [[1]] * 2)]))
    post(make_batch(rank=2, events=[grads(0, [[1]] * 2)]))
    assert [s.reported for s in GradSlot.objects.order_by("step")] == [1, 1]
    post(make_batch(rank=1, events=[grads(0, [[1]] * 1)]))
    assert [s.reported for s in GradSlot.objects.order_by("step")] == [3, 1]


@pytest.mark.parametrize("order", [(3, 0, 2, 1), (1, 2, 3, 0), (0, 1, 2, 3), (2, 3, 1, 0)])
def test_a_slot_is_complete_exactly_when_its_last_rank_reports_in_any_order(post, order):
    """The scan for a rank still below starts after the reporting rank and wraps around."""
    seen = []
    for rank in order:
        post(make_batch(rank=rank, world_size=4, events=[grads(0, [[1]])]))
        seen.append(GradSlot.objects.get().reported)
    assert seen == [1, 1, 1, 4]


def test_stride_spaces_the_steps(post):
    """With LOCKSTEP_GRAD_EVERY=K the agent packs steps K apart."""
    assert post(make_batch(events=[grads(4, [[1], [2], [3]], stride=4)])).status_code == 200
    assert list(GradReport.objects.order_by("step").values_list("step", "fps")) == [(4, [1]), (8, [2]), (12, [3])]
    assert Run.objects.get().last_step == 12


def test_wire_form_is_compact():
    """P7's budget (200 bytes per rank-step) holds for 16 buckets even before gzip."""
    event = protocol.Grads.pack(123456, [[(1 << 64) - 1 - s] * 16 for s in range(64)], ts=1.8e9)
    assert len(protocol.encode(event)) / 64 < 180
    assert base64.b64decode(protocol.msgspec.to_builtins(event)["fps"]) == event.fps
