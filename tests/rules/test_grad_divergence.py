from dashboard.detection.rules import clean_subjects, evaluate
from tests.rules import grad_view


def kinds(findings, kind):
    return [f for f in findings if f.kind == kind]


def test_dissenting_rank_bucket_and_step():
    [finding] = kinds(evaluate(grad_view({0: [1, 2, 3], 1: [1, 9, 3], 2: [1, 2, 3]}, step=7)), "grad_divergence")
    assert finding.ranks == (1,)
    assert finding.step == 7
    assert finding.details["buckets"] == [1]
    assert finding.details["tie"] is False
    assert finding.severity == "critical"
    assert finding.subject == "group:ddp"


def test_agreeing_replicas_raise_nothing():
    assert kinds(evaluate(grad_view({0: [1, 2], 1: [1, 2], 2: [1, 2]})), "grad_divergence") == []


def test_two_ranks_that_differ_are_both_named_and_neither_blamed():
    [finding] = kinds(evaluate(grad_view({0: [1], 1: [2]})), "grad_divergence")
    assert finding.ranks == (0, 1)
    assert finding.details["tie"] is True
    assert finding.message.startswith("Gradients of ranks 0 and 1 disagree at step 5")


def test_the_parameters_of_the_differing_buckets_are_named_in_module_order():
    view = grad_view({0: [1, 2, 3], 1: [1, 2, 3], 2: [1, 8, 9]})
    view.rank_info = {
        0: {
            "params": ["ddp:embed.weight", "ddp:fc.weight", "ddp:fc.bias", "ddp:_orig_mod.head.weight", "local:x"],
            "buckets": [[0], [1, 2], [3], [4]],
        }
    }
    [finding] = kinds(evaluate(view), "grad_divergence")
    assert finding.message == (
        "Gradients of rank 2 differ from the other replicas at step 5 (in fc.weight, fc.bias, head.weight)"
    )
    assert finding.details["parameters"] == ["fc.weight", "fc.bias", "_orig_mod.head.weight"]  # as the agents name them


def test_only_agreeing_weights_of_every_rank_resolve_it():
    """The weights differ from the update on: a later clean gradient slot proves nothing."""
    clean_grads = grad_view({0: [1, 2], 1: [1, 2], 2: [1, 2]}, step=8)
    assert ("grad_divergence", "group:ddp") not in clean_subjects(clean_grads, evaluate(clean_grads))
    assert ("nonfinite_grad", "group:ddp") not in clean_subjects(clean_grads, evaluate(clean_grads))
    weights = grad_view({0: [4, 5], 1: [4, 5], 2: [4, 5]}, step=9, group="param:ddp")
    cleared = clean_subjects(weights, evaluate(weights))
    assert ("grad_divergence", "group:ddp") in cleared and ("nonfinite_grad", "group:ddp") in cleared
    differing = grad_view({0: [4, 5], 1: [4, 6], 2: [4, 5]}, step=9, group="param:ddp")
    assert [f.kind for f in evaluate(differing)] == ["param_divergence"]
    assert ("grad_divergence", "group:ddp") not in clean_subjects(differing, evaluate(differing))
    partial = grad_view({0: [4, 5], 2: [4, 5]}, step=9, group="param:ddp")
    partial.world_size = 3  # rank 1, the one that diverged, did not fingerprint its weights
    assert ("grad_divergence", "group:ddp") not in clean_subjects(partial, evaluate(partial))
