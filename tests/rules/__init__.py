"""Each rule's own tests, on plain report objects: a rule is a pure function of one settled slot."""
from types import SimpleNamespace

from dashboard.detection.consensus import consensus
from dashboard.detection.rules import CompileSlotView, GradSlotView


def grad_view(fps_by_rank: dict[int, list[int]], step: int = 5, nonfinite: dict | None = None) -> GradSlotView:
    nonfinite = nonfinite or {}
    reports = {r: SimpleNamespace(fps=fps, nonfinite=nonfinite.get(r, 0)) for r, fps in fps_by_rank.items()}
    return GradSlotView(step, "ddp", reports, consensus({r: tuple(f) for r, f in fps_by_rank.items()}), len(reports))


def compile_view(reports: dict[int, dict], index: int = 1, accountable: set[int] | None = None,
                 frame: str = "train.py:10:forward") -> CompileSlotView:
    base = {"step": 3, "recompile_reason": None, "graph_norm": "a" * 16}
    rows = {r: SimpleNamespace(**{**base, **fields}) for r, fields in reports.items()}
    return CompileSlotView(frame, index, rows, accountable if accountable is not None else set(rows), len(rows))
