"""cache_divergence: ranks that compile the same code look up the compile caches with different
outcomes (tlparse's multi-rank "diverging cache hit/miss patterns").

Two ways a rank's pattern differs, both per compile slot (frame, n-th compile), for the FX graph
(Inductor) cache and the AOTAutograd cache:

- in one slot some ranks hit while others missed or bypassed (a cold or foreign cache dir, a
  graph the cache refused on some ranks); with no hit, ranks that bypassed while others missed;
- a compile only some ranks made (a lone recompile) looked the caches up there: its lookups are
  in that rank's pattern only, whatever their outcome. The recompile is the cause
  (`details["cause"]`: recompile_divergence of the same frame and ranks), so both land in one
  incident; these findings have a subject of their own (`subjects.recompile_lookups`), so that a
  cold rank's misses and another rank's lone recompile stay two alerts with their own ranks.

A later compile of the frame that every rank looked up alike resolves both.

Both are information (severity "info"), never a page: ranks of one node share an Inductor cache dir
by default, and which of them hits a cold one is a race (the ranks that start a compile after another
wrote its entry load it), not a divergence: the same graph, the same artifact. What a miss cost is in
the compile bill (`avoidable_miss`) and the timeline colours each compile by its outcome. An info
alert opens no incident; it joins one that explains it (the frame's recompile, straggler or hang
forecast: `incidents.FRAME_FOLLOWERS`), below its root.
"""

from __future__ import annotations

from collections.abc import Iterator

from dashboard.detection import subjects
from dashboard.detection.rules import (
    INFO,
    CompileSlotView,
    Finding,
    cache_outcome,
    first_step,
    ranks_text,
    rule,
    with_settings,
)

STAGES = {"inductor": "FX graph", "aotautograd": "AOTAutograd"}
OUTCOMES = ("hit", "miss", "bypass")
VERB = {"miss": "missed", "bypass": "bypassed", "hit": "hit"}


@rule(
    "cache_divergence",
    CompileSlotView,
    subject=lambda v: [subjects.frame(v.frame), subjects.recompile_lookups(v.frame)],
)
def cache_divergence(view: CompileSlotView) -> Iterator[Finding]:
    finding = _lone_recompile(view) or _split(view)
    if finding is not None:
        yield finding


def outcomes(view: CompileSlotView, stage: str) -> dict[int, str]:
    """rank -> hit | miss | bypass of one cache stage in this slot (ranks that looked it up)."""
    found = ((ranks, cache_outcome(e.cache or {}, stage)) for ranks, e in view.alike)
    return dict(sorted((r, o) for ranks, o in found if o in OUTCOMES for r in ranks))


def odd_ranks(by_rank: dict[int, str]) -> set[int]:
    """The ranks whose outcome is the odd one: those that did not hit where others did; with no hit,
    those that bypassed where others missed."""
    values = set(by_rank.values())
    if len(values) < 2:
        return set()
    odd = {"miss", "bypass"} if "hit" in values else {"bypass"}
    return {r for r, o in by_rank.items() if o in odd}


def _split(view: CompileSlotView) -> Finding | None:
    stages = {stage: outcomes(view, stage) for stage in STAGES}
    odd = {stage: odd_ranks(by_rank) for stage, by_rank in stages.items()}
    diverged = [stage for stage in STAGES if odd[stage]]
    if not diverged:
        return None
    ranks = set().union(*odd.values())
    first = diverged[0]
    others = sorted(r for r, o in stages[first].items() if r not in odd[first])
    verbs = sorted({stages[s][r] for s in diverged for r in odd[s]}, key=OUTCOMES.index)
    names = " and ".join(STAGES[s] for s in diverged)
    other_verb = VERB[stages[first][others[0]]]  # odd_ranks leaves one outcome to the others: hit, else miss
    message, settings = with_settings(
        f"{ranks_text(ranks).capitalize()} {'/'.join(VERB[v] for v in verbs)} the {names} cache"
        f"{'s' if len(diverged) > 1 else ''} for {view.frame} (compile #{view.index}) while "
        f"{ranks_text(others)} {other_verb} {'them' if len(diverged) > 1 else 'it'}",
        view,
    )
    return Finding(
        severity=INFO,
        subject=subjects.frame(view.frame),
        ranks=tuple(sorted(ranks)),
        step=first_step(view.reports, ranks),
        frame=view.frame,
        message=message,
        details={
            "index": view.index,
            "compile_index": view.index,
            "stage": first,
            **_by_outcome(stages[first]),
            "stages": {s: _by_outcome(stages[s]) for s in diverged},
            **_cause(view, ranks),
            **settings,
        },
    )


def _lone_recompile(view: CompileSlotView) -> Finding | None:
    """A compile of this frame that only a minority of the accountable ranks made, with cache lookups."""
    compiled = set(view.reports)
    skipped = view.accountable - compiled
    if view.index == 0 or not skipped or len(compiled) > len(skipped):
        return None
    stages = {stage: outcomes(view, stage) for stage in STAGES}
    looked = [stage for stage in STAGES if stages[stage]]
    if not looked:
        return None
    ranks = set().union(*(stages[s] for s in looked))
    verbs = sorted({o for s in looked for o in stages[s].values()}, key=OUTCOMES.index)
    return Finding(
        severity=INFO,
        subject=subjects.recompile_lookups(view.frame),
        ranks=tuple(sorted(ranks)),
        step=first_step(view.reports, ranks),
        frame=view.frame,
        message=f"{ranks_text(ranks).capitalize()} {'/'.join(VERB[v] for v in verbs)} the "
        f"{' and '.join(STAGES[s] for s in looked)} cache{'s' if len(looked) > 1 else ''} for {view.frame} in a "
        f"recompile {ranks_text(skipped)} did not make (compile #{view.index}): a lookup only "
        f"{'it' if len(ranks) == 1 else 'they'} made",
        details={
            "index": view.index,
            "compile_index": view.index,
            "stage": looked[0],
            **_by_outcome(stages[looked[0]]),
            "stages": {s: _by_outcome(stages[s]) for s in looked},
            "not_compiled": sorted(skipped),
            "cause": "recompile_divergence",
        },
    )


def _cause(view: CompileSlotView, ranks: set[int]) -> dict[str, str]:
    """A split in a recompile whose reason is the odd ranks' own: the recompile is its cause."""
    if view.index == 0:
        return {}
    reasons = {r: (e.recompile_reason or "") for r, e in view.reports.items()}
    theirs = {reasons[r] for r in ranks}
    rest = {reasons[r] for r in view.reports if r not in ranks}
    return {"cause": "recompile_divergence"} if rest and not theirs & rest else {}


def _by_outcome(by_rank: dict[int, str]) -> dict[str, list[int]]:
    return {o: sorted(r for r, v in by_rank.items() if v == o) for o in OUTCOMES if o in by_rank.values()}
