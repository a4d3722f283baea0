"""rank_silent: a rank stopped reporting while the others progressed (NoData). It inhibits the
rank's other alerts, and a rank that never reports a slot is silent, not divergent."""
from __future__ import annotations

from dashboard.detection.rules import Finding, RunView, rule


@rule("rank_silent", RunView, subject=lambda v: [f"rank:{r}" for r in v.last_seen])
def rank_silent(view: RunView):
    live = {r: age for r, age in view.last_seen.items() if r not in view.ended}
    freshest = min(live.values(), default=None)
    for rank, age in sorted(live.items()):
        if age >= view.silent_after and age - freshest >= view.silent_after:
            yield Finding(
                kind="rank_silent",
                severity="critical",
                subject=f"rank:{rank}",
                ranks=(rank,),
                message=f"Rank {rank} has sent nothing for {age:.0f} s while other ranks keep reporting",
                details={"silent_for_s": round(age, 1)},
            )
