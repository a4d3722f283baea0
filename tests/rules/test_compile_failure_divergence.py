from tests.rules import compile_view, findings_of


def test_failure_on_one_rank():
    view = compile_view(
        {0: {}, 1: {"status": "failed", "fail_type": "BackendCompilerFailed", "fail_reason": "boom"}, 2: {}}, index=0
    )
    [f] = findings_of(view, "compile_failure_divergence")
    assert f.ranks == (1,) and f.severity == "warning"
    assert "BackendCompilerFailed" in f.message


def test_failure_everywhere_is_not_a_divergence():
    view = compile_view({r: {"status": "failed"} for r in range(3)}, index=0)
    assert findings_of(view, "compile_failure_divergence") == []
