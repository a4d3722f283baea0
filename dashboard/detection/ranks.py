"""Where every rank is when a slot settles (each rank's reports of the slot: `dashboard.evidence.reads`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dashboard.tenancy.models import Rank, Run, has_ended


@dataclass
class RankState:
    """Where every rank is when a compile slot settles.

    A rank that completed the step a compile happened in, without reporting that compile, did
    not compile it: its events arrive in order, so the compile would have come before that
    step's gradients. A rank that is still before that step (compiling, or just slow) is not
    judged yet; one that stopped reporting altogether is rank_silent's business.
    """

    last_step: dict[int, int | None]
    last_seen: dict[int, datetime]
    ended: set[int]

    def accountable(self, step: int | None, since: datetime) -> set[int]:
        """Ranks whose absence from a slot means 'did not do it', not 'no data (yet)'."""
        if step is None:  # a compile outside the training steps: anything sent since it counts
            passed = {r for r, seen in self.last_seen.items() if seen >= since}
        else:
            passed = {r for r, last in self.last_step.items() if last is not None and last >= step}
        return passed | self.ended

    def behind(
        self, step: int | None, since: datetime, reported: set[int], now: datetime, silent_after: float
    ) -> set[int]:
        """Live ranks that may still report the slot: worth waiting for."""
        judged = self.accountable(step, since) | reported
        return {
            r for r, seen in self.last_seen.items() if r not in judged and (now - seen).total_seconds() < silent_after
        }


def rank_state(run: Run) -> RankState:
    rows = list(Rank.objects.filter(run=run).values_list("rank", "last_step", "last_seen", "status"))
    return RankState(
        last_step={r: last for r, last, _, _ in rows},
        last_seen={r: seen for r, _, seen, _ in rows},
        ended={r for r, _, _, status in rows if has_ended(status)},  # a lost rank's absence is no data
    )
