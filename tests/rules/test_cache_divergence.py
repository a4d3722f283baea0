from dashboard.detection.rules import cache_outcome
from tests.rules import compile_view, findings_of


def test_cold_cache_on_one_rank():
    view = compile_view({0: {"cache": {"inductor": "hit"}}, 1: {"cache": {"inductor": "miss"}},
                         2: {"cache": {"inductor": "hit,hit"}}}, index=0)
    [f] = findings_of(view, "cache_divergence")
    assert f.ranks == (1,)
    assert f.details == {"index": 0, "stage": "inductor", "hit": [0, 2], "miss": [1]}


def test_bypass_and_agreement_are_quiet():
    view = compile_view({0: {"cache": {"inductor": "bypass"}}, 1: {"cache": {"inductor": "miss"}}}, index=0)
    assert findings_of(view, "cache_divergence") == []
    assert findings_of(compile_view({0: {"cache": {"inductor": "miss"}}, 1: {"cache": {"inductor": "miss"}}}),
                       "cache_divergence") == []


def test_outcome_of_several_lookups():
    assert cache_outcome({"inductor": "hit,miss"}, "inductor") == "miss"
    assert cache_outcome({"inductor": "hit,hit"}, "inductor") == "hit"
    assert cache_outcome({}, "inductor") is None
