from dashboard.detection import subjects
from dashboard.detection.rules import clean_subjects, evaluate
from tests.rules import findings_of, run_view

TOP = {
    "frame": "model.py:46:forward",
    "label": "model.py:46 forward",
    "cause": "recompile",
    "reason": "dimension 0 of x changes",
    "remedy": "torch._dynamo.mark_dynamic(x, 0) before the call",
    "gpu_seconds": 5400.0,
    "ranks": [1],
    "basis": "assumed",
}


def costing(share: float, budget: float = 0.10):
    view = run_view({0: 1, 1: 1})
    view.compile_cost = {"share": share, "budget": budget, "gpu_seconds": 7200.0, "wall_s": 900.0, "top": TOP}
    return view


def test_fires_past_the_budget_naming_the_top_frame_cause_and_remedy():
    [f] = findings_of(costing(0.25), "compile_cost")
    assert (f.severity, f.frame, f.ranks, f.subject) == ("warning", TOP["frame"], (1,), subjects.COMPILE_SHARE)
    assert "25%" in f.message and "dimension 0 of x changes" in f.message and "mark_dynamic(x, 0)" in f.message
    assert f.details["cause"] == "recompile" and f.details["remedy"] == TOP["remedy"]


def test_quiet_under_the_budget_and_without_a_bill():
    assert findings_of(costing(0.09), "compile_cost") == []
    assert findings_of(run_view({0: 1}), "compile_cost") == []


def test_resolves_only_well_under_the_budget():
    view = costing(0.09)  # between 80% of the budget and the budget: neither fires nor resolves
    assert ("compile_cost", subjects.COMPILE_SHARE) not in clean_subjects(view, evaluate(view))
    view = costing(0.05)
    assert ("compile_cost", subjects.COMPILE_SHARE) in clean_subjects(view, evaluate(view))


def test_says_device_time_where_the_ranks_did_not_all_report_a_gpu():
    view = costing(0.25)
    assert "of the run's GPU time (2.00 GPU-hours" in findings_of(view, "compile_cost")[0].message
    view.compile_cost["device"] = "device"  # bills.for_sweep: cost.devices(run), a CPU job
    [f] = findings_of(view, "compile_cost")
    assert "of the run's device time (2.00 device-hours" in f.message and "1.50 device-hours" in f.message
    assert "GPU" not in f.message
