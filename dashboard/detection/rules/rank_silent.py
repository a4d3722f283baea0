"""rank_silent: a rank stopped reporting while the others progressed (NoData). It inhibits the
rank's other alerts, and a rank that never reports a slot is silent, not divergent.

Two ways to be silent: the others keep reporting (a rank hung in a driver call or frozen), or
every other rank has ended and this one never said goodbye (killed outright, e.g. by SIGKILL or the
OOM killer: torchrun then stops the others, which send their rank_end, while it sends nothing).
The second is told fast (`LOCKSTEP_LOST_AFTER`, two heartbeats and a margin): its peers' crashes
wait for it as their root, and the page should name the dead rank within seconds."""

from __future__ import annotations

from collections.abc import Iterator

from dashboard.detection import subjects
from dashboard.detection.rules import Finding, RunView, rule

KEEP_REPORTING = "while other ranks keep reporting"
LEFT_ALONE = "and never ended, while every other rank did (killed outright, e.g. by SIGKILL or the OOM killer?)"


def silent_ranks(view: RunView) -> dict[int, str]:
    """rank -> why it counts as silent (see the module docstring). While the others keep reporting,
    silence counts from the last time ingest turned batches away for load at the latest (`ingest.shed`):
    until then the rank's may have been among them. A rank left alone by its ended peers is lost as
    before: a refused goodbye comes back within seconds (the agent resends it), well inside `lost_after`."""
    seen = view.ranks
    live = {r: age for r, age in seen.quiet.items() if r not in seen.ended}
    behind = left_behind(view, live)
    out = {}
    for rank, age in live.items():
        if min(age, view.since_shed) >= view.silent_after and age - seen.freshest_live >= view.silent_after:
            out[rank] = KEEP_REPORTING
        elif rank in behind:
            out[rank] = LEFT_ALONE
    return out


def watch_after(silent_after: float, lost_after: float) -> float:
    """How long a rank is quiet before this rule looks at it by name: the view names the ranks quiet
    this long (`runs.liveness`), and none quieter can be silent or left behind."""
    return min(silent_after, lost_after)


def left_behind(view: RunView, live: dict[int, float]) -> set[int]:
    """Ranks that never ended in a job that is over: all of them stale while others ended. Alone, the
    rank is lost; with company (a stopped rank can die before its goodbye is out), the lost ones are
    those silent since before the first rank ended: the others were still talking when the job was
    stopped around them. `live` holds every live rank here: all are stale, so all are quiet."""
    seen = view.ranks
    if seen.oldest_end is None or not live or seen.freshest_live < watch_after(view.silent_after, view.lost_after):
        return set()
    if seen.live == 1:
        return set(live)
    return {r for r, age in live.items() if age > seen.oldest_end}


def ended_message(rank: int, quiet_s: float, lost: bool) -> str:
    """The alert's last word once the run ended: how long the rank was quiet before the end, no
    longer counting up with the clock (a run over is over)."""
    how = "and never ended (killed outright?)" if lost else "while the other ranks kept reporting"
    return f"Rank {rank} sent nothing for the last {quiet_s:.0f} s before the run ended, {how}"


@rule("rank_silent", RunView, subject=lambda v: [subjects.rank(r) for r in v.ranks.quiet])
def rank_silent(view: RunView) -> Iterator[Finding]:
    for rank, why in sorted(silent_ranks(view).items()):
        age = view.ranks.quiet[rank]
        yield Finding(
            severity="critical",
            subject=subjects.rank(rank),
            ranks=(rank,),
            message=f"Rank {rank} has sent nothing for {age:.0f} s {why}",
            details={"silent_for_s": round(age, 1), "lost": why == LEFT_ALONE},
        )
