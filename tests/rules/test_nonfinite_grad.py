from dashboard.detection.rules import evaluate
from tests.rules import grad_view


def test_nan_on_one_rank():
    findings = evaluate(grad_view({0: [1], 1: [1], 2: [1]}, nonfinite={2: 5}))
    [finding] = [f for f in findings if f.kind == "nonfinite_grad"]
    assert finding.ranks == (2,)
    assert finding.details["nonfinite"] == {2: 5}


def test_nan_everywhere_is_not_a_divergence():
    findings = evaluate(grad_view({0: [1], 1: [1]}, nonfinite={0: 1, 1: 1}))
    assert [f for f in findings if f.kind == "nonfinite_grad"] == []
