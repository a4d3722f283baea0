from tests.rules import findings_of, grad_view


def test_weights_differ_on_one_rank():
    view = grad_view({0: [1, 2], 1: [1, 2], 2: [1, 3]}, group="param:ddp", step=20)
    [f] = findings_of(view, "param_divergence")
    assert f.ranks == (2,) and f.step == 20 and f.details["buckets"] == [1]
    assert findings_of(view, "grad_divergence") == []  # weights are not gradients


def test_gradient_groups_are_not_weights():
    assert findings_of(grad_view({0: [1], 1: [2], 2: [1]}), "param_divergence") == []


def test_two_ranks_whose_weights_differ_are_named_with_their_parameters():
    view = grad_view({0: [4, 5], 1: [4, 6]}, step=9, group="param:ddp")
    view.rank_info = {0: {"params": ["ddp:encoder.weight", "ddp:decoder.weight"], "buckets": [[0], [1]]}}
    [finding] = findings_of(view, "param_divergence")
    assert finding.ranks == (0, 1)
    assert finding.message == "Weights of ranks 0 and 1 disagree at step 9 (in decoder.weight)"
