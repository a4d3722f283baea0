from dashboard.detection.rules import rules_for
from tests.rules import compile_view, findings_of, run_view


def test_eighth_compile_of_a_frame():
    assert findings_of(compile_view({0: {}}, index=6), "recompile_storm") == []
    [f] = findings_of(compile_view({0: {"recompile_reason": "size mismatch"}}, index=7), "recompile_storm")
    assert f.details["compiles"] == 8 and "size mismatch" in f.message


def test_recompile_limit_hit():
    view = compile_view({0: {"fail_reason": "torch._dynamo hit config.recompile_limit (8)"}, 1: {}}, index=2)
    [f] = findings_of(view, "recompile_storm")
    assert f.ranks == (0,) and "recompile limit" in f.message


def test_compile_share_is_compile_costs_not_the_storms():
    """One cause, one alert: the share of wall time is `compile_cost`'s (tests/rules/test_compile_cost.py)."""
    assert "recompile_storm" not in {r.kind for r in rules_for(run_view({0: 1}))}
    assert "compile_cost" in {r.kind for r in rules_for(run_view({0: 1}))}
