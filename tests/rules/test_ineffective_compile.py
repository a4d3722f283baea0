from tests.rules import compile_view, findings_of

EMPTY = {"detail": {"counts": {"graph_op_count": 0}, "graph_breaks": 2}}
BREAK = "Logger.set_runtime_stats_and_log: skipped"


def test_empty_graphs_name_the_break_reasons():
    view = compile_view({0: EMPTY, 1: EMPTY}, index=0, graph_breaks=[(0, BREAK), (1, BREAK), (1, "other")])
    [f] = findings_of(view, "ineffective_compile")
    assert f.ranks == (0, 1) and f.subject == "run"
    assert f.details["break_reasons"][0] == BREAK and BREAK in f.message


def test_shredded_by_breaks():
    view = compile_view({0: {"detail": {"counts": {"graph_op_count": 3}, "graph_breaks": 9}}}, index=0)
    [f] = findings_of(view, "ineffective_compile")
    assert "shredded" in f.message


def test_real_graphs_are_fine():
    assert findings_of(compile_view({0: {}, 1: {}}, index=0), "ineffective_compile") == []


def test_long_dynamo_break_text_is_cut_to_its_explanation():
    from dashboard.detection.rules.ineffective_compile import headline

    text = ("Graph break in user code at contextlib.py:105\nGraph Break Reason: Encountered graph break\n\n"
            "Attempted to call function marked as skipped\n  Explanation: Dynamo developers have intentionally "
            "marked that the function `DistributedDataParallel._inside_ddp_forward` should not be traced.\n"
            "  Hint: Avoid calling the function\nUser code traceback: ...")
    assert headline(text).startswith("Explanation: Dynamo developers")
    assert "_inside_ddp_forward" in headline(text) and "traceback" not in headline(text)
