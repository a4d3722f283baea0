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


def test_ranks_running_other_compiler_settings_are_named():
    reports = {0: {"cache": {"inductor": "hit"}}, 1: {"cache": {"inductor": "miss"}}, 2: {"cache": {"inductor": "hit"}}}
    info = {0: {"settings": {"inductor.fx_graph_cache": "True"}},
            1: {"settings": {"inductor.fx_graph_cache": "True", "inductor.triton.cudagraphs": "False"}},
            2: {"settings": {"inductor.fx_graph_cache": "True"}}}
    [f] = findings_of(compile_view(reports, index=0, rank_info=info), "cache_divergence")
    assert f.message.endswith("(rank 1 runs with `inductor.triton.cudagraphs=False`)")
    assert f.details["settings"] == {"inductor.triton.cudagraphs": {"0": "default", "1": "False", "2": "default"}}
    same = {r: {"settings": {"inductor.fx_graph_cache": "True"}} for r in range(3)}
    [quiet] = findings_of(compile_view(reports, index=0, rank_info=same), "cache_divergence")
    assert "runs with" not in quiet.message and "settings" not in quiet.details
