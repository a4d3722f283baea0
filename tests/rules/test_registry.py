import pkgutil

from dashboard.detection import rules
from dashboard.detection.rules import REGISTRY, clean_subjects
from tests.rules import grad_view

PROMISED_KINDS = {
    "graph_divergence",
    "recompile_divergence",
    "compile_failure_divergence",
    "rank_specific_artifact",
    "collective_schedule_divergence",
    "cache_divergence",
    "compile_straggler",
    "ineffective_compile",
    "recompile_storm",
    "grad_divergence",
    "param_divergence",
    "nonfinite_grad",
    "rank_silent",
    "hang_forecast",
    "rank_crashed",
    "baseline_divergence",
    "compile_cost",
}


def test_every_design_rule_is_registered_once_per_module():
    rules.load_all()
    assert {r.kind for r in REGISTRY} == PROMISED_KINDS
    modules = {m.name for m in pkgutil.iter_modules(rules.__path__)}
    assert {r.check.__module__.rsplit(".", 1)[1] for r in REGISTRY} == modules


def test_clean_subjects_are_what_was_checked_and_did_not_fire():
    view = grad_view({0: [1], 1: [2], 2: [1]})
    findings = [f for r in REGISTRY if isinstance(view, r.view) for f in r.check(view)]
    clean = clean_subjects(view, findings)
    assert ("grad_divergence", "group:ddp") not in clean
    assert ("nonfinite_grad", "group:ddp") not in clean  # only agreeing weights resolve it
    assert ("param_divergence", "group:ddp") in clean
