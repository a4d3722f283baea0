from dashboard.detection.rules import evaluate
from tests.rules import compile_view

REASON = "size mismatch at index 0. expected 16, actual 17"


def recompiles(view):
    return [f for f in evaluate(view) if f.kind == "recompile_divergence"]


def test_one_rank_recompiles_alone():
    view = compile_view({1: {"recompile_reason": REASON, "step": 4}}, accountable={0, 1, 2})
    [finding] = recompiles(view)
    assert finding.ranks == (1,)
    assert finding.step == 4
    assert finding.frame == "train.py:10:forward"
    assert REASON in finding.message
    assert finding.details["not_compiled"] == [0, 2]


def test_one_rank_missing_a_recompile_the_others_did():
    view = compile_view({0: {}, 2: {}}, accountable={0, 1, 2})
    [finding] = recompiles(view)
    assert finding.ranks == (1,)
    assert "did not recompile" in finding.message


def test_silent_ranks_are_not_counted_as_divergent():
    view = compile_view({0: {}, 2: {}}, accountable={0, 2})
    assert recompiles(view) == []


def test_same_recompile_everywhere_is_fine():
    view = compile_view({r: {"recompile_reason": REASON} for r in range(3)})
    assert recompiles(view) == []


def test_another_reason_on_one_rank():
    view = compile_view(
        {0: {"recompile_reason": REASON}, 1: {"recompile_reason": "grad mode changed"}, 2: {"recompile_reason": REASON}}
    )
    [finding] = recompiles(view)
    assert finding.ranks == (1,)
    assert "grad mode changed" in finding.message


def test_first_compiles_are_not_recompiles():
    assert recompiles(compile_view({0: {}}, index=0, accountable={0, 1})) == []


def test_two_ranks_recompiling_for_other_reasons_disagree():
    view = compile_view({0: {"recompile_reason": "size of x changed"}, 1: {"recompile_reason": "grad mode changed"}})
    [finding] = recompiles(view)
    assert finding.ranks == (0, 1) and finding.details["tie"] is True
    assert finding.message.startswith("Ranks 0 and 1 disagree on why they recompiled train.py:10:forward")


def test_of_two_ranks_recompiling_for_other_reasons_the_earlier_one_is_named():
    from dashboard.detection.rules import evaluate
    from tests.rules import compile_view

    view = compile_view(
        {0: {"step": 8, "recompile_reason": "size mismatch at index 0"}, 1: {"step": 3, "recompile_reason": "x > 2"}}
    )
    [finding] = [f for f in evaluate(view) if f.kind == "recompile_divergence"]
    assert finding.ranks == (1,) and finding.details["tie"] is False
    assert finding.message.endswith("recompiled train.py:10:forward for another reason: x > 2")
