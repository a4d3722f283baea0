"""Replicas recognised by what they do (dashboard/detection/replicas.py): parameters outside torch's
DDP ("local") are compared once their gradients agree on every rank, and never otherwise."""

from __future__ import annotations

import pytest

from dashboard.detection import settle
from dashboard.detection.models import Alert
from dashboard.ledger.models import GradSlot
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


def job(post, grads, weights, run="hand", world_size=3, group="local", steps=(0,)):
    """Each rank's gradient and weight fingerprints of `group` (`grads(rank, step)`, `weights(rank, step)`,
    each (fps, norm) / fps); then every slot settled in step order."""
    for rank in range(world_size):
        events = []
        for s in steps:
            fps, norm = grads(rank, s)
            events += [
                {"t": "grad", "step": s, "group": group, "fps": fps, "norm": norm},
                {"t": "param", "step": s, "group": group, "fps": weights(rank, s)},
            ]
        response = post(make_batch(run=run, rank=rank, world_size=world_size, events=events))
        assert response.status_code == 200, response.content
    for slot in GradSlot.objects.filter(run__key=run).order_by("step", "group"):
        settle.settle_grad(slot.id)


def alerts() -> list[tuple[str, list[int], int | None]]:
    return sorted((a.kind, a.ranks, a.step) for a in Alert.objects.all())


def test_a_hand_written_all_reduce_with_one_rank_seeded_differently_pages_at_that_rank(post):
    """Gradients averaged by hand agree on every rank; rank 2's weights, from another seed, do not."""
    job(post, grads=lambda r, s: ([11, 12], 3.5), weights=lambda r, s: [5, 9 if r == 2 else 6])
    assert alerts() == [("param_divergence", [2], 0)]
    [slot] = GradSlot.objects.filter(group="local")
    assert slot.consensus["replicas"] is True


def test_once_shown_to_be_replicas_a_later_gradient_divergence_is_named(post):
    job(
        post,
        grads=lambda r, s: ([s, 7 if (r == 1 and s == 2) else 0], 1.0),
        weights=lambda r, s: [s],
        steps=(0, 1, 2),
    )
    assert ("grad_divergence", [1], 2) in alerts()


def test_independent_ranks_are_never_compared_and_their_heatmap_stays_clean(post):
    """An ensemble, pipeline stages, expert shards: gradients and weights differ from the start."""
    job(post, grads=lambda r, s: ([r, s], 1.0 + r), weights=lambda r, s: [r * 10 + s], steps=(0, 1, 2))
    assert alerts() == []
    assert all(slot.settled_at and slot.dissenters == [] for slot in GradSlot.objects.all())


def test_zero_gradients_that_agree_prove_nothing(post):
    """Frozen parameters (or a step with no loss) have zero gradients on any model: no evidence."""
    job(post, grads=lambda r, s: ([0, 0], 0.0), weights=lambda r, s: [r])
    assert alerts() == []


def test_two_ranks_that_agree_then_differ_name_the_pair(post):
    job(post, world_size=2, grads=lambda r, s: ([4], 2.0), weights=lambda r, s: [r])
    [(kind, ranks, step)] = alerts()
    assert (kind, step) == ("param_divergence", 0) and ranks == [0, 1]
