from dashboard.detection.rules import evaluate
from tests.rules import compile_view


def graph(view):
    return [f for f in evaluate(view) if f.kind == "graph_divergence"]


def test_rank_tracing_another_graph():
    view = compile_view({0: {}, 1: {"graph_norm": "f" * 16}, 2: {}}, index=0)
    [finding] = graph(view)
    assert finding.ranks == (1,)
    assert finding.details["hashes"]["1"] == "f" * 16


def test_equal_graphs_raise_nothing():
    assert graph(compile_view({0: {}, 1: {}, 2: {}}, index=0)) == []


def test_single_report_cannot_diverge():
    assert graph(compile_view({0: {}}, index=0, accountable={0, 1})) == []


def test_the_graph_of_a_rank_with_other_settings_names_them():
    info = {0: {}, 1: {"settings": {"dynamo.assume_static_by_default": "False"}}, 2: {}}
    [finding] = graph(compile_view({0: {}, 1: {"graph_norm": "f" * 16}, 2: {}}, index=0, rank_info=info))
    assert "rank 1 runs with `dynamo.assume_static_by_default=False`" in finding.message


def test_two_ranks_with_other_graphs_disagree_and_neither_is_blamed():
    [finding] = graph(compile_view({0: {}, 1: {"graph_norm": "f" * 16}}, index=0))
    assert finding.ranks == (0, 1) and finding.details["tie"] is True
    assert finding.message.startswith("Ranks 0 and 1 disagree on the graph for train.py:10:forward")
