"""The bill's arithmetic on plain compiles (`cost.compute`), and what a guard failure reads as."""

import pytest

from dashboard.detection.cost import BILL_ROWS, Compile, compute
from dashboard.detection.remedies import reason_line, remedy

F, G = "model.py:46:forward", "model.py:90:loss"
SIZE = "0/0: tensor 'x' size mismatch at index 0. expected 16, actual 17"


def c(rank, frame=F, index=0, step=0, seconds=1.0, **kw):
    return Compile(rank=rank, frame=frame, index=index, step=step, status=kw.pop("status", "ok"), seconds=seconds, **kw)


def lines(bill, cause):
    return [x for x in bill["lines"] if x["cause"] == cause]


def test_a_step_costs_world_size_times_its_slowest_rank():
    bill = compute(4, [c(0, seconds=2.0), c(1, seconds=3.0), c(1, G, seconds=1.0), c(2, seconds=2.5)], wall_s=100)
    assert bill["gpu_seconds"] == pytest.approx(4 * 4.0)  # rank 1: 3 + 1 s; ranks 0, 2, 3 wait for it
    assert {f["frame"]: f["gpu_seconds"] for f in bill["frames"]} == pytest.approx({F: 12.0, G: 4.0})
    assert bill["share"] == pytest.approx(16.0 / 400) and bill["basis"]["assumed_units"] == 1


def test_measured_waits_replace_the_assumption():
    compiles = [c(1, index=1, step=7, seconds=20.0, reason=SIZE)]
    waits = {7: {0: 12.0, 2: 19.5, 3: 1.0}}  # rank 3's 1 s sample is a heartbeat's glimpse, not a wait
    bill = compute(4, compiles, waits)
    assert bill["gpu_seconds"] == pytest.approx(20.0 + 12.0 + 19.5 + 20.0)
    assert bill["basis"] == {
        "assumed_units": 0,
        "measured_units": 1,
        "assumed_s": 0.0,
        "measured_s": pytest.approx(71.5),
    }
    [line] = lines(bill, "recompile")
    assert line["basis"] == "measured" and line["reason"] == "dimension 0 of x changes"


def test_one_reason_is_one_line_however_often_it_fired():
    compiles = [
        c(
            1,
            index=i,
            step=10 * i,
            seconds=2.0,
            reason=f"0/{i - 1}: tensor 'x' size mismatch at index 0. expected {16 + i}, actual {17 + i}",
        )
        for i in range(1, 6)
    ]
    [line] = lines(compute(2, compiles), "recompile")
    assert line["compiles"] == 5 and line["gpu_seconds"] == pytest.approx(5 * 2 * 2.0)
    assert line["remedy"].startswith("torch._dynamo.mark_dynamic(x, 0)")


def test_a_miss_another_rank_hit_or_an_earlier_run_had_is_avoidable():
    compiles = [
        c(0, seconds=1.0, outcome="hit", key="k1", end=101.0),
        c(1, seconds=9.0, outcome="miss", key="k1", end=109.0),
        c(0, G, step=2, seconds=4.0, outcome="miss", key="k2", end=200.0),
        c(1, G, step=1, seconds=4.0, outcome="miss", key="k3", end=150.0),
    ]
    bill = compute(2, compiles, had_before={"k3"})
    assert [x["frame"] for x in lines(bill, "avoidable_miss")] == [F, G]  # k1 on rank 1; k3 on rank 1
    assert lines(bill, "avoidable_miss")[0]["gpu_seconds"] == pytest.approx(18.0)
    assert [x["frame"] for x in lines(bill, "first_compile")] == [G]  # k2: nobody had it


def test_only_another_ranks_hit_makes_a_miss_avoidable():
    compiles = [
        c(0, seconds=1.0, outcome="hit", key="k1", end=91.0),  # rank 0's own hit, before its miss: not another's
        c(0, G, step=1, seconds=5.0, outcome="miss", key="k1", end=120.0),  # rank 2's hit began at 100: avoidable
        c(2, seconds=1.0, outcome="hit", key="k1", end=101.0),
        c(1, G, step=2, seconds=2.0, outcome="miss", key="k1", end=95.0),  # rank 0's hit began at 90: avoidable
        c(3, seconds=1.0, outcome="hit", key="k2", end=91.0),
        c(3, G, step=3, seconds=3.0, outcome="miss", key="k2", end=130.0),  # only its own hit: not avoidable
    ]
    bill = compute(4, compiles)
    [line] = lines(bill, "avoidable_miss")
    assert line["compiles"] == 2 and line["ranks"] == [0, 1]
    assert [x["compiles"] for x in lines(bill, "recompile") + lines(bill, "first_compile") if x["frame"] == G] == [1]


def test_a_hit_that_began_after_the_miss_ended_loaded_what_the_miss_wrote():
    compiles = [
        c(0, seconds=9.0, outcome="miss", key="k1", end=109.0),
        c(1, seconds=1.0, outcome="hit", key="k1", end=111.0),
    ]
    bill = compute(2, compiles)
    assert lines(bill, "avoidable_miss") == [] and lines(bill, "first_compile")[0]["gpu_seconds"] == pytest.approx(18.0)
    assert bill["savings"]["gpu_seconds"] == 0  # the hit did not shorten the step: rank 0 compiled anyway


def test_a_straggler_is_billed_for_what_it_took_beyond_the_median():
    compiles = [c(r, seconds=2.0) for r in range(3)] + [c(3, seconds=14.0)]
    bill = compute(4, compiles)
    [slow] = lines(bill, "compile_straggler")
    assert slow["gpu_seconds"] == pytest.approx(4 * 12.0) and slow["ranks"] == [3]
    assert lines(bill, "first_compile")[0]["gpu_seconds"] == pytest.approx(4 * 2.0)
    assert bill["gpu_seconds"] == pytest.approx(4 * 14.0)


def test_failed_compiles_and_warm_cache_savings():
    compiles = [
        c(0, status="failed", fail_type="BackendCompilerFailed", seconds=3.0),
        c(0, G, step=1, seconds=10.0, outcome="miss", key="a", end=50),
        c(1, G, step=1, seconds=10.0, outcome="miss", key="a", end=50),
        c(0, G, index=1, step=2, seconds=1.0, outcome="hit", key="b", end=60),
        c(1, G, index=1, step=2, seconds=1.0, outcome="hit", key="b", end=60),
    ]
    bill = compute(2, compiles, price=2.0)
    [failed] = lines(bill, "failed_compile")
    assert failed["reason"] == "BackendCompilerFailed" and failed["gpu_seconds"] == pytest.approx(6.0)
    assert bill["savings"]["gpu_seconds"] == pytest.approx(2 * 9.0) and bill["savings"]["hits"] == 2
    assert bill["money"] == pytest.approx(round(bill["gpu_seconds"] / 3600 * 2.0, 2))


def test_first_compiles_of_a_frame_with_graph_breaks_point_at_the_break():
    [line] = lines(compute(2, [c(0)], breaks={F: 3}), "first_compile")
    assert line["reason"] == "3 graph breaks in this frame" and "graph break" in line["remedy"]


@pytest.mark.parametrize(
    "text,line",
    [
        (SIZE, "dimension 0 of x changes"),
        ("0/0: tensor 'args[0]' size mismatch at index 0. expected 16, actual 17", "dimension 0 of args[0] changes"),
        ("tensor 'L['x']' stride mismatch at index 1. expected 3, actual 1", "stride 1 of x changes"),
        ("0/1: tensor 'x' dtype mismatch. expected Float, actual Double", "dtype of x changes"),
        ("0/5: tensor 'x' rank mismatch. expected 1, actual 2", "number of dimensions of x changes"),
        (
            "0/2: n == 2                                                   # return x * n  # a.py:8 in f",
            "value of n changes",
        ),
        ("0/4: len(xs) == 2", "length of xs changes"),
        ("0/0: L['self'].training == True", "value of self.training changes"),
        ("0/0: ___check_obj_id(L['cfg'], 140234)", "object of cfg changes"),
        ("0/0: 2 <= L['x'].size()[0] <= 64; 0/1: something else", "N <= x.size()[N] <= N"),
    ],
)
def test_guard_failures_read_as_what_changed(text, line):
    assert reason_line(text) == line


def test_remedies_are_one_line_each():
    assert remedy("recompile", "dimension 1 of batch changes").startswith("torch._dynamo.mark_dynamic(batch, 1)")
    assert "dynamic=True" in remedy("recompile", "stride 1 of x changes")
    assert "TORCHINDUCTOR_CACHE_DIR" in remedy("avoidable_miss") and "TORCHINDUCTOR_CACHE_DIR" in remedy(
        "first_compile"
    )
    assert all("\n" not in remedy(cause) for cause in ("first_compile", "compile_straggler", "failed_compile"))


def test_a_bill_lists_its_costliest_frames_and_lines_and_sums_the_rest():
    """Was: every frame and line listed (a run of 40,000 frames: a bill of 17.5 MiB)."""
    frames = [c(0, f"model.py:{i}:f{i}", step=i, seconds=1.0 + i / 1000) for i in range(BILL_ROWS + 150)]
    reasons = [
        c(1, F, index=i, step=10_000 + i, seconds=0.5, reason=f"0/{i - 1}: tensor 'x{i}' size mismatch at index 0")
        for i in range(1, BILL_ROWS + 51)
    ]
    bill = compute(2, frames + reasons)
    assert len(bill["frames"]) == BILL_ROWS and bill["frames"][0]["frame"] == F  # the costliest first
    assert bill["frames_left_out"]["count"] == len(frames) + 1 - BILL_ROWS  # F and every other frame, less those shown
    shown = sum(f["gpu_seconds"] for f in bill["frames"])
    assert shown + bill["frames_left_out"]["gpu_seconds"] == pytest.approx(bill["gpu_seconds"], abs=0.01)
    forward = bill["frames"][0]
    assert len(forward["lines"]) == BILL_ROWS and forward["lines_left_out"]["count"] == 50
    assert len(bill["lines"]) == BILL_ROWS and bill["lines_left_out"]["count"] == len(frames) + len(reasons) - BILL_ROWS
    listed = sum(x["gpu_seconds"] for x in bill["lines"])
    assert listed + bill["lines_left_out"]["gpu_seconds"] == pytest.approx(bill["gpu_seconds"], abs=0.01)


def test_a_graph_break_inside_torchs_own_code_gets_no_remedy_the_user_cannot_apply():
    ddp = "torch/nn/parallel/distributed.py:1600:DistributedDataParallel._inside_ddp_forward"
    inside = remedy("graph_break", "graph break: skipped function", ddp)
    assert "DDP(torch.compile(model))" in inside and "explain" not in inside
    assert "torch._dynamo.explain" in remedy("graph_break", "graph break: skipped function", "train.py:10:forward")
