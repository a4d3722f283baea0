"""rank_specific_artifact: the same normalized Dynamo graph compiles to rank-specific Inductor code or
cache keys while ranks share a cache directory, so one rank's cache entry is wrong for another.

Code is compared only between ranks with the same cache outcome: code loaded from the cache is
not printed the way freshly generated code is, so a hit next to a miss proves nothing.
"""
from __future__ import annotations

from collections import defaultdict

from dashboard.detection.consensus import consensus
from dashboard.detection import subjects
from dashboard.detection.rules import CompileSlotView, Finding, ranks_text, rule


def shared_cache_dirs(view: CompileSlotView) -> list[str]:
    dirs = [set((info.get("cache_dirs") or {}).values()) for info in view.rank_info.values() if info]
    return sorted(set.intersection(*dirs)) if len(dirs) >= 2 else []


def _keys(event) -> str:
    return "|".join(f"{k}={v}" for k, v in sorted(((event.detail or {}).get("cache_keys") or {}).items()))


def _differing(values: dict) -> tuple[int, ...]:
    values = {r: v for r, v in values.items() if v}
    return consensus(values).dissenters if len(set(values.values())) > 1 else ()


def _code_dissenters(view: CompileSlotView) -> tuple[int, ...]:
    by_outcome = defaultdict(dict)
    for rank, event in view.reports.items():
        by_outcome[(event.cache or {}).get("inductor", "")][rank] = event.code_norm
    return tuple(sorted(r for group in by_outcome.values() for r in _differing(group)))


@rule("rank_specific_artifact", CompileSlotView, subject=lambda v: subjects.frame(v.frame))
def rank_specific_artifact(view: CompileSlotView):
    graphs = {e.graph_norm for e in view.reports.values()}
    if len(view.reports) < 2 or len(graphs) != 1 or not next(iter(graphs)):
        return
    shared = shared_cache_dirs(view)
    if not shared:
        return
    for what, dissenters in (("cache keys", _differing({r: _keys(e) for r, e in view.reports.items()})),
                             ("Inductor code", _code_dissenters(view))):
        if dissenters:
            yield Finding(
                severity="warning",
                ranks=dissenters,
                frame=view.frame,
                message=f"{view.frame}: same graph on every rank but {what} differ on {ranks_text(dissenters)}, "
                f"and the ranks share cache dir {shared[0]}",
                details={"index": view.index, "artifact": what, "shared_cache_dirs": shared},
            )
            return
