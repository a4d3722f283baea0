from dashboard.detection.rules import evaluate
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


def test_two_ranks_tie_is_reported_against_rank_0():
    [finding] = kinds(evaluate(grad_view({0: [1], 1: [2]})), "grad_divergence")
    assert finding.ranks == (1,)
    assert finding.details["tie"] is True
