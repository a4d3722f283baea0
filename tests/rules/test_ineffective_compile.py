from dashboard.detection.rules import CompiledWorkView, RankWork, clean_subjects
from tests.rules import compile_view, findings_of

EMPTY = {"detail": {"counts": {"graph_op_count": 0}, "graph_breaks": 2}}
WRAPPERS = ("train.py:40:train_step", "train.py:40:train_step via contextlib.__init__")


def work_view(work: dict, last_step: dict, ended: set | None = None) -> CompiledWorkView:
    return CompiledWorkView(1, work, last_step, ended or set())


def test_a_rank_whose_every_compile_is_empty_runs_eager_once_its_step_is_done():
    """The container-only model under torch.compile(DDP(model)): DDP's wrapper frames are all it compiles."""
    empty = RankWork(graphs=0, empty=3, first_step=0, empty_frames=WRAPPERS)
    [f] = findings_of(work_view({0: empty, 1: empty}, {0: 1, 1: 2}), "ineffective_compile")
    assert f.ranks == (0, 1) and f.subject == "run" and f.step == 0 and f.frame == WRAPPERS[0]
    assert "runs mostly eager" in f.message and "train.py:40 train_step via contextlib.__init__" in f.message


def test_no_verdict_while_the_step_of_the_empty_compiles_may_still_compile_the_model():
    """torch.compile(DDP(model)) of a real model: the wrappers' empty graphs come first, the blocks'
    real graphs a compile later; until the rank finished that step nothing is known."""
    empty = RankWork(graphs=0, empty=3, first_step=0, empty_frames=WRAPPERS)
    view = work_view({0: empty}, {0: 0})
    assert findings_of(view, "ineffective_compile") == []
    assert ("ineffective_compile", "run") in clean_subjects(view, [])
    assert findings_of(work_view({0: empty}, {0: None}, ended={0}), "ineffective_compile") != []


def test_empty_wrappers_next_to_real_graphs_are_a_compiled_model():
    mixed = RankWork(graphs=1, empty=3, first_step=0, empty_frames=WRAPPERS)
    assert findings_of(work_view({0: mixed}, {0: 5}), "ineffective_compile") == []


def test_an_empty_frame_alone_is_no_verdict_on_its_slot():
    assert findings_of(compile_view({0: EMPTY, 1: EMPTY}, index=0), "ineffective_compile") == []


def test_shredded_by_breaks():
    view = compile_view(
        {0: {"detail": {"counts": {"graph_op_count": 3}, "graph_breaks": 9}}},
        index=0,
        graph_breaks=[(0, "Graph Break Reason: a\nExplanation: skipped")],
    )
    [f] = findings_of(view, "ineffective_compile")
    assert "shredded" in f.message and f.subject == "frame:train.py:10:forward" and "skipped" in f.message


def test_real_graphs_are_fine():
    assert findings_of(compile_view({0: {}, 1: {}}, index=0), "ineffective_compile") == []


def test_long_dynamo_break_text_is_cut_to_its_explanation():
    from dashboard.detection.rules.ineffective_compile import headline

    text = (
        "Graph break in user code at contextlib.py:105\nGraph Break Reason: Encountered graph break\n\n"
        "Attempted to call function marked as skipped\n  Explanation: Dynamo developers have intentionally "
        "marked that the function `DistributedDataParallel._inside_ddp_forward` should not be traced.\n"
        "  Hint: Avoid calling the function\nUser code traceback: ..."
    )
    assert headline(text).startswith("Explanation: Dynamo developers")
    assert "_inside_ddp_forward" in headline(text) and "traceback" not in headline(text)


def test_a_shredded_frame_speaks_of_that_frame_not_of_the_model():
    view = compile_view(
        {0: {"detail": {"counts": {"graph_op_count": 3}, "graph_breaks": 12}}},
        index=0,
        frame="torch/optim/adam.py:200:step",
    )
    [f] = findings_of(view, "ineffective_compile")
    assert f.message.startswith(
        "torch/optim/adam.py:200:step is shredded by 12 graph breaks on rank 0: much of this frame"
    )
    assert "model" not in f.message
