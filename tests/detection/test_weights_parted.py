"""What to do about weights that differ depends on how they came apart (issue 52, item 6): with every
gradient of the group in agreement there is no grad_divergence to find; the update itself differed (a
rank's learning rate), so the incident says to compare that rank's optimizer settings."""

from __future__ import annotations

import pytest

from dashboard.detection import settle
from dashboard.detection.models import Alert, Incident, weights_parted
from dashboard.ledger.models import GradSlot
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


def job(post, grads, weights, steps=(0, 1, 2), run="lr"):
    """3 DDP ranks: `grads(rank, step)` and `weights(rank, step)` fingerprints (weights at steps 0
    and 2, after those steps' updates); every slot settled in step order."""
    for rank in range(3):
        events = [{"t": "grad", "step": s, "fps": grads(rank, s), "norm": 1.0} for s in steps]
        events += [{"t": "param", "step": s, "fps": weights(rank, s)} for s in (0, 2)]
        assert post(make_batch(run=run, rank=rank, events=events)).status_code == 200
    for slot in GradSlot.objects.filter(run__key=run).order_by("step", "group"):
        settle.settle_grad(slot.id)


def remedy(run: str = "lr") -> str:
    [incident] = Incident.objects.filter(run__key=run)
    return incident.as_json()["remedy"]["text"]


def test_a_learning_rate_mismatch_says_to_compare_that_ranks_optimizer(post):
    """Gradients agree at every step (the all-reduce averages them); rank 2 steps further with them."""
    job(post, grads=lambda r, s: [s + 1, 7], weights=lambda r, s: [s, 9 if (r == 2 and s == 2) else 0])
    [alert] = Alert.objects.all()
    assert (alert.kind, alert.ranks, alert.step) == ("param_divergence", [2], 2)
    assert weights_parted(alert) == "update"
    text = remedy()
    assert text.startswith("the gradients agreed, the weights did not: compare the optimizer settings of rank 2")
    assert "learning rate" in text and "grad_divergence" not in text


def test_weights_apart_from_their_first_fingerprint_also_name_the_start(post):
    job(post, grads=lambda r, s: [s + 1, 7], weights=lambda r, s: [s, 9 if r == 2 else 0])
    assert weights_parted(Alert.objects.get(kind="param_divergence")) == "first"
    assert "optimizer settings of rank 2" in remedy() and "same weights" in remedy()


def test_weights_apart_after_a_gradient_divergence_keep_the_gradient_story(post):
    job(
        post,
        grads=lambda r, s: [s + 1, 5 if (r == 2 and s == 1) else 7],
        weights=lambda r, s: [s, 9 if (r == 2 and s == 2) else 0],
    )
    assert weights_parted(Alert.objects.get(kind="param_divergence")) == ""
    assert "optimizer" not in remedy()
