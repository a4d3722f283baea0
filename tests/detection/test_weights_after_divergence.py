"""After a gradient divergence the server asks every rank for its weights a step or two later (the
`weights_at` reply key), and only a weight slot on which every rank agrees resolves the divergence:
through the real ingest endpoint, PostgreSQL and the settle code the Celery task runs."""

from __future__ import annotations

import pytest

from dashboard.detection import settle
from dashboard.detection.models import Alert
from dashboard.ledger.models import GradSlot, WeightsRequest
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

RANKS = 3


def send(post, rank: int, seq: int, events: list) -> dict:
    response = post(make_batch(run="drift", rank=rank, world_size=RANKS, seq=seq, events=events))
    assert response.status_code == 200, response.content
    return response.json()


def settle_all(step: int, group: str = "ddp") -> None:
    settle.settle_grad(GradSlot.objects.get(run__key="drift", step=step, group=group).id)


def test_a_divergence_asks_for_weights_and_stays_open_until_they_agree(post):
    for rank in range(RANKS):  # rank 1's gradients differ at step 3
        send(post, rank, 0, [{"t": "rank_start"}, {"t": "grad", "step": 3, "fps": [7, 8 + (rank == 1)]}])
    settle_all(3)
    alert = Alert.objects.get(kind="grad_divergence")
    assert alert.ranks == [1] and alert.state == "firing"
    [(asked, group, alert_id)] = WeightsRequest.objects.values_list("step", "group", "alert_id")
    assert asked > 3 and (group, alert_id) == ("ddp", alert.id)  # one row asks every rank

    replies = {rank: send(post, rank, 1, [{"t": "grad", "step": 4, "fps": [7, 8]}]) for rank in range(RANKS)}
    assert all(reply["weights_at"] == [asked] for reply in replies.values())  # the same step for every rank
    assert replies[1]["detail"] == [3] and replies[0]["detail"] == [3]  # the parameters still get named
    again = send(post, 0, 2, [{"t": "heartbeat", "step": 5}])
    assert again["weights_at"] == [asked]  # told again while below it: a reply lost on the way is made good

    settle_all(4)  # clean gradients: the weights still differ
    assert Alert.objects.get(id=alert.id).state == "firing"

    for rank in range(RANKS):  # rank 1's weights differ: param_divergence confirms it
        answered = send(post, rank, 3, [{"t": "param", "step": asked, "fps": [5, 6 + (rank == 1)]}])
        assert "weights_at" not in answered  # at the step: the weight slot is the answer
    settle_all(asked, "param:ddp")
    assert Alert.objects.get(kind="param_divergence").ranks == [1]
    assert Alert.objects.get(id=alert.id).state == "firing"

    later = asked + 50
    for rank in range(RANKS):  # the replicas agree again (a checkpoint reload, a broadcast)
        send(post, rank, 4, [{"t": "param", "step": later, "fps": [5, 6]}])
    settle_all(later, "param:ddp")
    assert Alert.objects.get(id=alert.id).state == "resolved"
    assert Alert.objects.get(kind="param_divergence").state == "resolved"
