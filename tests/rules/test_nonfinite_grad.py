from dashboard.detection.rules import clean_subjects, evaluate
from tests.rules import grad_view


def nonfinite(view):
    return [f for f in evaluate(view) if f.kind == "nonfinite_grad"]


def test_nan_on_one_rank():
    [finding] = nonfinite(grad_view({0: [1], 1: [1], 2: [1]}, nonfinite={2: 5}))
    assert finding.ranks == (2,)
    assert finding.details["nonfinite"] == {2: 5}


def test_nan_on_every_rank_is_one_critical_finding_naming_them_all():
    """The all-reduce spread one rank's inf to every replica: no rank differs, and that is no reason
    to stay silent."""
    [finding] = nonfinite(grad_view({0: [1], 1: [1], 2: [1]}, step=12, nonfinite={0: 3, 1: 3, 2: 3}))
    assert finding.severity == "critical" and finding.ranks == (0, 1, 2) and finding.step == 12
    assert finding.message.startswith("Gradients non-finite on all ranks from step 12")
    assert finding.subject == "nonfinite-everywhere:ddp"


def test_nan_everywhere_is_resolved_by_finite_gradients_not_by_agreeing_weights():
    nan_weights = grad_view({0: [7], 1: [7]}, step=13, group="param:ddp")  # all NaN: they agree
    assert ("nonfinite_grad", "nonfinite-everywhere:ddp") not in clean_subjects(nan_weights, evaluate(nan_weights))
    finite = grad_view({0: [1], 1: [1]}, step=14)
    assert ("nonfinite_grad", "nonfinite-everywhere:ddp") in clean_subjects(finite, evaluate(finite))
    still = grad_view({0: [1], 1: [1]}, step=14, nonfinite={0: 1, 1: 1})
    assert ("nonfinite_grad", "nonfinite-everywhere:ddp") not in clean_subjects(still, evaluate(still))


def test_the_rank_whose_loss_went_non_finite_first_is_the_root():
    view = grad_view({0: [1], 1: [1], 2: [1]}, step=12, nonfinite={0: 3, 1: 3, 2: 3})
    view.nonfinite_losses = {1: 11, 0: 12, 2: 12}
    [finding] = nonfinite(view)
    assert finding.ranks == (1,) and finding.details["loss_first"] == {"rank": 1, "step": 11}
    assert "rank 1's loss went non-finite first (step 11)" in finding.message
    view.nonfinite_losses = {0: 11, 1: 11}  # two at once: nobody went first
    assert nonfinite(view)[0].ranks == (0, 1, 2)
