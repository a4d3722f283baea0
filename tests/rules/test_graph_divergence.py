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


def test_of_two_ranks_the_one_that_traced_its_graph_first_changed_and_is_named():
    """Rank 1 takes a data-dependent branch at step 5; rank 0 keeps its graph until step 9."""
    view = compile_view({0: {"step": 9}, 1: {"graph_norm": "f" * 16, "step": 5}}, index=1)
    [finding] = graph(view)
    assert finding.ranks == (1,) and finding.details["tie"] is False and finding.step == 5
    assert finding.message.startswith("Rank 1 traced another graph at step 5, where the others kept theirs")


def test_two_ranks_that_traced_other_graphs_in_the_same_step_disagree():
    [finding] = graph(compile_view({0: {"step": 5}, 1: {"graph_norm": "f" * 16, "step": 5}}, index=1))
    assert finding.ranks == (0, 1) and finding.details["tie"] is True
