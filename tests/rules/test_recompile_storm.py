from tests.rules import compile_view, findings_of, run_view


def test_eighth_compile_of_a_frame():
    assert findings_of(compile_view({0: {}}, index=6), "recompile_storm") == []
    [f] = findings_of(compile_view({0: {"recompile_reason": "size mismatch"}}, index=7), "recompile_storm")
    assert f.details["compiles"] == 8 and "size mismatch" in f.message


def test_recompile_limit_hit():
    view = compile_view({0: {"fail_reason": "torch._dynamo hit config.recompile_limit (8)"}, 1: {}}, index=2)
    [f] = findings_of(view, "recompile_storm")
    assert f.ranks == (0,) and "recompile limit" in f.message


def test_compile_share_of_wall_time():
    assert findings_of(run_view({0: 1}, compile_seconds=200, wall_seconds=700), "recompile_storm")
    assert findings_of(run_view({0: 1}, compile_seconds=100, wall_seconds=700), "recompile_storm") == []
    assert findings_of(run_view({0: 1}, compile_seconds=200, wall_seconds=300), "recompile_storm") == []
