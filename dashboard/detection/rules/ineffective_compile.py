"""ineffective_compile: the model runs mostly eager while the user believes it is compiled.

Judged on the share of a rank's work inside compiled graphs, not on one frame: under
torch.compile(DDP(model)) DDP's wrapper frames (the user's `model(x)` line, DDP's context managers)
compile to empty graphs while each of the model's own modules compiles to a real graph, and that
model is compiled. A rank fires only when none of its compiles holds an op once it has finished the
step they started in (or ended): e.g. a model made only of torch.nn containers under
torch.compile(DDP(model)), where Dynamo starts no frame inside torch. A frame shredded by graph
breaks is judged on its own slot, and its message speaks of that frame only: a compiled optimizer
step with breaks says nothing about how the model runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from agents.normalize import frame_label
from dashboard.detection import subjects
from dashboard.detection.rules import CompiledWorkView, CompileSlotView, Finding, ranks_text, rule

MANY_BREAKS = 8


def headline(reason: str) -> str:
    """Dynamo's break text runs to pages; its first explanation line names the culprit."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    useful = [line for line in lines if line.startswith(("Explanation:", "Graph Break Reason:"))]
    return (useful[-1] if useful else (lines[0] if lines else ""))[:300]


@rule("ineffective_compile", CompiledWorkView, subject=lambda v: subjects.RUN)
def model_runs_eager(view: CompiledWorkView) -> Iterator[Finding]:
    eager = sorted(r for r, work in view.work.items() if work.empty and not work.graphs and view.known(r))
    if not eager:
        return
    frames = sorted({f for r in eager for f in view.work[r].empty_frames})
    steps = [step for r in eager if (step := view.work[r].first_step) is not None]
    shown = ", ".join(frame_label(f) for f in frames[:3]) + (", ..." if len(frames) > 3 else "")
    yield Finding(
        severity="warning",
        ranks=tuple(eager),
        step=min(steps, default=None),
        frame=frames[0] if frames else None,
        message=f"No compiled graph holds an op on {ranks_text(eager)}: every compiled frame ({shown}) is empty, "
        "so the model runs mostly eager (torch.compile(DDP(model)) of a model made only of torch.nn modules does this: "
        "compile the model inside DDP instead, DDP(torch.compile(model)))",
        details={"empty_graph_ranks": eager, "empty_frames": frames[:20]},
    )


@rule("ineffective_compile", CompileSlotView)
def shredded(view: CompileSlotView) -> Iterator[Finding]:
    ranks = {r for r, e in view.reports.items() if ((e.detail or {}).get("graph_breaks") or 0) >= MANY_BREAKS}
    if not ranks:
        return
    reasons = Counter(headline(reason) for r, reason in view.graph_breaks if r in ranks)
    top = [reason for reason, _ in reasons.most_common(3)]
    breaks = max((view.reports[r].detail or {}).get("graph_breaks") or 0 for r in ranks)
    yield Finding(
        severity="warning",
        subject=subjects.frame(view.frame),
        ranks=tuple(sorted(ranks)),
        frame=view.frame,
        message=f"{view.frame} is shredded by {breaks} graph breaks on {ranks_text(ranks)}: "
        "much of this frame runs eager between its graphs" + (f". Graph breaks: {'; '.join(top)}" if top else ""),
        details={"index": view.index, "shredded_ranks": sorted(ranks), "break_reasons": top},
    )
