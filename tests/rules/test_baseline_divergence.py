from tests.rules import findings_of, grad_view


def test_consensus_differs_from_the_baseline():
    [f] = findings_of(grad_view({0: [1, 2], 1: [1, 2]}, step=4, baseline=[1, 9]), "baseline_divergence")
    assert (f.step, f.details["buckets"], f.details["baseline"]) == (4, [1], "base-run")


def test_equal_or_no_baseline():
    assert findings_of(grad_view({0: [1, 2], 1: [1, 2]}, baseline=[1, 2]), "baseline_divergence") == []
    assert findings_of(grad_view({0: [1, 2], 1: [1, 2]}), "baseline_divergence") == []
