"""compile_cost: the run's compile bill passed its budget, a share of the GPU time the run has had
("device time" where its ranks did not all say they compute on a CUDA device, `cost.devices`)
(LOCKSTEP_COMPILE_BUDGET, default 10 %, once the run is LOCKSTEP_COMPILE_BUDGET_AFTER old, default
10 minutes). Names the frame and cause that cost most and the remedy; `frame` is that frame, so
the alert joins the open recompile incident of that frame. Resolves once the share falls below
RESOLVE_AT of the budget (the run amortized it), so a share hovering at the budget does not flap.
"""

from __future__ import annotations

from collections.abc import Iterator

from dashboard.detection import subjects
from dashboard.detection.rules import Finding, RunView, rule

RESOLVE_AT = 0.8
CAUSE_TEXT = {
    "first_compile": "first compiles",
    "recompile": "recompiles",
    "avoidable_miss": "cache misses another rank or an earlier run had the entry for",
    "compile_straggler": "a compile straggler",
    "failed_compile": "failed compiles",
}


def checked(view: RunView) -> list[str]:
    """The subject counts as healthy (its alert may resolve) unless the share sits between RESOLVE_AT
    of the budget and the budget."""
    bill = view.compile_cost
    if bill and bill.get("share") is not None and bill["share"] > RESOLVE_AT * bill["budget"]:
        return []
    return [subjects.COMPILE_SHARE]


@rule("compile_cost", RunView, subject=checked)
def compile_cost(view: RunView) -> Iterator[Finding]:
    bill = view.compile_cost
    if not bill or bill.get("share") is None or bill["share"] <= bill["budget"] or not bill.get("top"):
        return
    top = bill["top"]
    cause = CAUSE_TEXT.get(top["cause"], top["cause"]) + (f" ({top['reason']})" if top["reason"] else "")
    hours = bill["gpu_seconds"] / 3600
    unit = bill.get("device") or "GPU"
    yield Finding(
        severity="warning",
        subject=subjects.COMPILE_SHARE,
        ranks=tuple(top["ranks"]),
        frame=top["frame"],
        message=f"Compilation took {bill['share']:.0%} of the run's {unit} time ({hours:.2f} {unit}-hours, budget "
        f"{bill['budget']:.0%}); most in {top['label']}: {cause}, {top['gpu_seconds'] / 3600:.2f} {unit}-hours. "
        f"Remedy: {top['remedy']}",
        details={
            "share": round(bill["share"], 4),
            "budget": bill["budget"],
            "gpu_seconds": bill["gpu_seconds"],
            "wall_s": round(bill["wall_s"], 1),
            "cause": top["cause"],
            "reason": top["reason"],
            "remedy": top["remedy"],
            "top_gpu_seconds": top["gpu_seconds"],
            "basis": top["basis"],
        },
    )
