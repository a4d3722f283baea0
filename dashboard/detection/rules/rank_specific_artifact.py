"""rank_specific_artifact: the same normalized Dynamo graph compiles to rank-specific Inductor code or
cache keys while ranks share a cache directory, so one rank's cache entry is wrong for another.
"""
from __future__ import annotations

from dashboard.detection.consensus import consensus
from dashboard.detection.rules import CompileSlotView, Finding, ranks_text, rule


def shared_cache_dirs(view: CompileSlotView) -> list[str]:
    dirs = [set((info.get("cache_dirs") or {}).values()) for info in view.rank_info.values() if info]
    return sorted(set.intersection(*dirs)) if len(dirs) >= 2 else []


@rule("rank_specific_artifact", CompileSlotView, subject=lambda v: f"frame:{v.frame}")
def rank_specific_artifact(view: CompileSlotView):
    graphs = {e.graph_norm for e in view.reports.values()}
    if len(view.reports) < 2 or len(graphs) != 1 or not next(iter(graphs)):
        return
    shared = shared_cache_dirs(view)
    if not shared:
        return
    for what, value in (("Inductor code", lambda e: e.code_norm), ("cache keys", lambda e: _keys(e))):
        values = {r: value(e) for r, e in view.reports.items() if value(e)}
        if len(set(values.values())) > 1:
            verdict = consensus(values)
            yield Finding(
                kind="rank_specific_artifact",
                severity="warning",
                subject=f"frame:{view.frame}",
                ranks=verdict.dissenters,
                frame=view.frame,
                message=f"{view.frame}: same graph on every rank but {what} differ on "
                f"{ranks_text(verdict.dissenters)}, and the ranks share cache dir {shared[0]}",
                details={"index": view.index, "artifact": what, "shared_cache_dirs": shared, "tie": verdict.tie},
            )
            return


def _keys(event) -> str:
    return "|".join(f"{k}={v}" for k, v in sorted(((event.detail or {}).get("cache_keys") or {}).items()))
