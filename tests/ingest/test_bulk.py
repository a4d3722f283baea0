"""POST /api/v1/ingest/bulk: several ranks' batches in one transaction, each keeping its own identity."""

from __future__ import annotations

import json
import uuid

import msgspec
import pytest

from agents import protocol
from dashboard.evidence.models import CompileEvent, GradReport, StepReport
from dashboard.ledger.models import CompileSlot, GradSlot
from dashboard.tenancy.models import Rank, Run
from tests import claims
from tests.conftest import make_batch, per_rank, post_bulk
from tests.ingest.test_blobs import HASH, compile_event

pytestmark = pytest.mark.django_db


def encoded(batch: dict) -> bytes:
    return json.dumps(batch, separators=(",", ":")).encode()


@pytest.fixture
def bulk(client, token):
    """POST batches (dicts or their exact JSON bytes) as one bulk body, gzipped as a relay sends it."""

    def _bulk(batches, *, raw: bytes | None = None):
        body = (
            raw if raw is not None else protocol.bulk_body([b if isinstance(b, bytes) else encoded(b) for b in batches])
        )
        return post_bulk(client, token, body)

    return _bulk


def grads(rank: int, steps: int) -> dict:
    return msgspec.to_builtins(protocol.Grads.pack(0, [[rank + 1]] * steps))


def stored() -> tuple[int, int, int, int]:
    return claims.count(), GradReport.objects.count(), Rank.objects.count(), StepReport.objects.count()


def test_every_rank_of_a_node_in_one_request(bulk):
    batches = [
        make_batch(
            rank=r,
            events=[{"t": "grad", "step": s, "fps": [r, s]} for s in range(2)]
            + [{"t": "step", "step": 1, "step_time": 0.1}],
        )
        for r in range(3)
    ]
    response = bulk(batches)
    assert response.status_code == 200, response.content
    assert response.json() == {"results": [{"accepted": 3, "duplicate": False, "want_blobs": [], "detail": []}] * 3}
    assert stored() == (3, 6, 3, 3)
    assert per_rank(GradReport.objects) == [(r, s, [r, s]) for r in range(3) for s in range(2)]
    assert Run.objects.get(key="run-a").last_step == 1
    # all three ranks reported both steps in this one request: both slots are complete
    assert [(s.step, s.reported) for s in GradSlot.objects.order_by("step")] == [(0, 3), (1, 3)]


def test_a_batch_already_received_on_either_endpoint_is_a_duplicate(bulk, post):
    first, second = make_batch(rank=0), make_batch(rank=1)
    assert post(encoded(first)).json()["duplicate"] is False
    response = bulk([first, second])
    assert [r["duplicate"] for r in response.json()["results"]] == [True, False]
    assert [r["accepted"] for r in response.json()["results"]] == [0, 1]
    assert stored()[:2] == (2, 2)
    assert post(encoded(second)).json() == {"accepted": 0, "duplicate": True, "want_blobs": [], "detail": []}
    assert stored()[:2] == (2, 2)


def test_a_batch_twice_in_one_request_is_stored_once_and_answered_as_a_duplicate(bulk):
    batch = make_batch(rank=0)
    response = bulk([batch, batch, make_batch(rank=1)])
    assert response.status_code == 200, response.content
    assert [(r["accepted"], r["duplicate"]) for r in response.json()["results"]] == [(1, False), (0, True), (1, False)]
    assert claims.count() == 2
    assert per_rank(GradReport.objects) == [(0, 0, [1, 2, 3]), (1, 0, [1, 2, 3])]


def test_other_content_under_a_received_seq_refuses_the_whole_request(bulk, post):
    assert post(encoded(make_batch(rank=0))).status_code == 200
    before = stored()
    changed = make_batch(rank=0, events=[{"t": "grad", "step": 0, "fps": [9, 9, 9]}])
    response = bulk([make_batch(rank=1), changed])
    assert response.status_code == 409
    assert response.json()["path"] == "batches[1].seq"
    assert stored() == before  # the other rank's batch was rolled back with it


@pytest.mark.parametrize(
    "batches, path",
    [
        ([make_batch(rank=0), make_batch(rank=5)], "batches[1].rank"),
        ([make_batch(rank=0), make_batch(events=[{"t": "grad", "step": "x", "fps": []}])], "batches[1].events[0].step"),
        ([make_batch(events=[{"t": "nope"}])], "batches[0].events[0].t"),
        ([make_batch(rank=0), {"v": 1}], "batches[1].run"),
    ],
)
def test_an_invalid_batch_names_its_place_and_nothing_is_stored(bulk, batches, path):
    response = bulk(batches)
    assert response.status_code == 400, response.content
    assert response.json()["path"] == path
    assert stored() == (0, 0, 0, 0)


@pytest.mark.parametrize(
    "raw, path",
    [
        (b'{"v":1,"batches":[]}', "batches"),
        (b'{"v":3,"batches":[{}]}', "v"),
        (b'{"v":1,"batches":' + b"[{}]" * 2, None),
        (
            protocol.bulk_body([encoded(make_batch(rank=r, session=f"s-{uuid.uuid4()}")) for r in range(3)] * 100),
            "batches",
        ),
    ],
)
def test_a_malformed_envelope_is_a_400(bulk, raw, path):
    response = bulk([], raw=raw)
    assert response.status_code == 400, response.content
    assert response.json().get("path") == path
    assert stored() == (0, 0, 0, 0)


def test_compact_grads_of_several_ranks_share_one_copy(bulk):
    response = bulk([make_batch(rank=r, events=[grads(r, 4)]) for r in range(3)])
    assert response.status_code == 200, response.content
    assert per_rank(GradReport.objects) == [(r, s, [r + 1]) for r in range(3) for s in range(4)]
    assert [s.reported for s in GradSlot.objects.order_by("step")] == [3, 3, 3, 3]


def test_agreeing_ranks_share_a_row_per_step_whatever_their_batching(bulk):
    """Replicas report the same fingerprints but batch them differently: packed in one event, in two,
    or as single `grad` events. Each step is stored once, listing every rank; settling sees all three."""
    from dashboard.detection import settle
    from dashboard.detection.models import Alert

    rows = [[s, s + 1] for s in range(4)]
    norms = [0.5, 1.5, 2.5, 3.5]
    split = [protocol.Grads.pack(0, rows[:2], norms=norms[:2]), protocol.Grads.pack(2, rows[2:], norms=norms[2:])]
    listed = [{"t": "grad", "step": s, "fps": rows[s], "norm": norms[s]} for s in range(4)]
    response = bulk(
        [
            make_batch(rank=0, events=[msgspec.to_builtins(protocol.Grads.pack(0, rows, norms=norms))]),
            make_batch(rank=1, events=[msgspec.to_builtins(e) for e in split]),
            make_batch(rank=2, events=listed),
        ]
    )
    assert response.status_code == 200, response.content
    assert sorted(GradReport.objects.values_list("step", "ranks", "norm")) == [
        (s, [0, 1, 2], norms[s]) for s in range(4)
    ]
    assert per_rank(GradReport.objects) == sorted((r, s, rows[s]) for r in range(3) for s in range(4))
    for slot in GradSlot.objects.order_by("step"):
        assert slot.reported == 3
        settle.settle_grad(slot.id)
    assert not Alert.objects.exists()
    assert [(s.pending, s.dissenters) for s in GradSlot.objects.order_by("step")] == [(False, [])] * 4


def test_a_dissenting_rank_keeps_its_own_rows_and_is_named(bulk):
    from dashboard.detection import settle
    from dashboard.detection.models import Alert

    def batch(rank: int, last: list[int], nonfinite: list[int] | None = None) -> dict:
        event = protocol.Grads.pack(0, [[1, 2], [3, 4], [5, 6], last], nonfinite=nonfinite or [])
        return make_batch(rank=rank, events=[msgspec.to_builtins(event)])

    assert bulk([batch(0, [7, 8]), batch(1, [7, 8]), batch(2, [7, 9], nonfinite=[0, 0, 0, 3])]).status_code == 200
    assert sorted(GradReport.objects.filter(step=3).values_list("ranks", "fps", "nonfinite")) == [
        ([0, 1], [7, 8], 0),
        ([2], [7, 9], 3),
    ]
    assert list(GradReport.objects.filter(step__lt=3).values_list("ranks", flat=True)) == [[0, 1, 2]] * 3
    for slot in GradSlot.objects.order_by("step"):
        settle.settle_grad(slot.id)
    assert sorted(Alert.objects.values_list("kind", "ranks", "step")) == [
        ("grad_divergence", [2], 3),
        ("nonfinite_grad", [2], 3),
    ]


def test_a_graph_text_is_asked_of_one_batch_only(bulk):
    results = bulk([make_batch(rank=r, events=[compile_event()]) for r in range(3)]).json()["results"]
    assert [r["want_blobs"] for r in results] == [[HASH], [], []]


def test_each_batch_counts_against_the_rate_limit(bulk, settings):
    settings.LOCKSTEP_RATE_LIMIT = 2
    response = bulk([make_batch(rank=r) for r in range(3)])
    assert response.status_code == 429
    assert response["Retry-After"] == "1"
    assert stored() == (0, 0, 0, 0)


def test_late_reports_of_several_ranks_count_each(bulk):
    from dashboard.detection import settle

    assert bulk([make_batch(rank=0)]).status_code == 200
    slot = GradSlot.objects.get()
    settle.settle_grad(slot.id)
    assert bulk([make_batch(rank=1), make_batch(rank=2)]).status_code == 200
    slot.refresh_from_db()
    assert slot.reported == 3 and slot.pending


def test_one_rank_twice_and_its_start_and_end(bulk):
    start = {"t": "rank_start", "host": "node3", "pid": 7, "versions": {"torch": "2.13.0"}}
    end = {"t": "rank_end", "status": "failed", "exit_code": -6}
    response = bulk(
        [
            make_batch(rank=1, seq=0, events=[start, {"t": "grad", "step": 0, "fps": [1]}]),
            make_batch(rank=2, seq=0),
            make_batch(rank=1, seq=1, events=[{"t": "grad", "step": 1, "fps": [1]}, end]),
        ]
    )
    assert [r["accepted"] for r in response.json()["results"]] == [2, 1, 2]
    rank = Rank.objects.get(rank=1)
    assert (rank.host, rank.pid, rank.info["versions"], rank.status, rank.exit_code, rank.last_step) == (
        "node3",
        7,
        {"torch": "2.13.0"},
        "failed",
        -6,
        1,
    )
    assert (Rank.objects.get(rank=2).status, Run.objects.get().torch_version) == ("running", "2.13.0")


def test_ranks_reporting_different_steps_in_one_request(bulk):
    from dashboard.detection import settle

    def steps(rank: int, seq: int, numbers: list[int]) -> dict:
        return make_batch(rank=rank, seq=seq, events=[{"t": "grad", "step": s, "fps": [1]} for s in numbers])

    assert bulk([steps(0, 0, [0, 1]), steps(1, 0, [1, 2])]).status_code == 200
    assert [s.step for s in GradSlot.objects.order_by("step")] == [0, 1, 2]
    settle.settle_grad(GradSlot.objects.get(step=1).id)
    assert bulk([steps(2, 0, [1]), steps(0, 1, [2, 3])]).status_code == 200
    reported = dict(GradSlot.objects.values_list("step", "reported"))
    assert reported[1] == 3 and reported[3] == 1  # step 1: settled with ranks 0 and 1, then rank 2 came late


def test_run_facts_refused_name_the_batch(bulk):
    assert bulk([make_batch(rank=0)]).status_code == 200
    response = bulk([make_batch(rank=1), make_batch(rank=2, world_size=5)])
    assert response.status_code == 400
    assert response.json()["path"] == "batches[1].run.world_size"
    assert stored()[0] == 1


def test_a_node_s_compile_reports_count_each_rank_once_per_slot(bulk):
    """A job's start: every rank of the request reports the same compile slots (written together)."""
    compile_ = {
        "t": "compile",
        "frame": "train.py:10:forward",
        "index": 0,
        "step": 0,
        "hashes": {"dynamo": {"raw": "a" * 16, "norm": "b" * 16}},
    }
    later = {**compile_, "index": 1, "step": 2}
    batches = [make_batch(rank=0, events=[compile_, compile_, later])] + [
        make_batch(rank=r, events=[compile_]) for r in (1, 2)
    ]
    response = bulk(batches)
    assert response.status_code == 200, response.content
    assert sorted(CompileSlot.objects.values_list("index", "step", "reported")) == [(0, 0, 3), (1, 2, 1)]
    assert sorted(CompileEvent.objects.values_list("rank", "index")) == [(0, 0), (0, 0), (0, 1), (1, 0), (2, 0)]
