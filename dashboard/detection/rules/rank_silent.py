"""rank_silent: a rank stopped reporting while the others progressed (NoData). It inhibits the
rank's other alerts, and a rank that never reports a slot is silent, not divergent.

Two ways to be silent: the others keep reporting (a rank hung in a driver call or frozen), or
every other rank has ended and this one never said goodbye (killed outright, e.g. by the OOM
killer: torchrun then stops the others, which send their rank_end, while it sends nothing)."""
from __future__ import annotations

from dashboard.detection import subjects
from dashboard.detection.rules import Finding, RunView, rule


@rule("rank_silent", RunView, subject=lambda v: [subjects.rank(r) for r in v.last_seen])
def rank_silent(view: RunView):
    live = {r: age for r, age in view.last_seen.items() if r not in view.ended}
    freshest = min(live.values(), default=None)
    left_alone = len(live) == 1 and len(view.last_seen) > 1
    for rank, age in sorted(live.items()):
        if age < view.silent_after:
            continue
        if age - freshest >= view.silent_after:
            why = "while other ranks keep reporting"
        elif left_alone:
            why = "and never ended, while every other rank did (killed, e.g. by the OOM killer?)"
        else:
            continue
        yield Finding(
            severity="critical",
            subject=subjects.rank(rank),
            ranks=(rank,),
            message=f"Rank {rank} has sent nothing for {age:.0f} s {why}",
            details={"silent_for_s": round(age, 1)},
        )
