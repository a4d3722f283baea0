from tests.rules import findings_of, grad_view


def test_consensus_differs_from_the_baseline():
    [f] = findings_of(grad_view({0: [1, 2], 1: [1, 2]}, step=4, baseline=[1, 9]), "baseline_divergence")
    assert (f.step, f.details["buckets"], f.details["baseline"]) == (4, [1], "base-run")


def test_equal_or_no_baseline():
    assert findings_of(grad_view({0: [1, 2], 1: [1, 2]}, baseline=[1, 2]), "baseline_divergence") == []
    assert findings_of(grad_view({0: [1, 2], 1: [1, 2]}), "baseline_divergence") == []


def test_the_parameters_of_the_differing_buckets_are_named_not_their_numbers():
    view = grad_view({0: [1, 2, 3], 1: [1, 2, 3]}, step=4, baseline=[1, 8, 9])
    view.rank_info = {
        1: {"params": ["ddp:wte.weight", "ddp:h.0.attn.weight", "ddp:lm_head.weight"], "buckets": [[0], [1], [2]]}
    }
    [f] = findings_of(view, "baseline_divergence")
    assert f.message == "Gradients differ from baseline run base-run from step 4 (in h.0.attn.weight, lm_head.weight)"
