"""Where the ranks stand when a compile slot settles, and the start facts its rules read, both by
aggregate: a job's start opens its compile slots while 100,000 ranks report, and reading every
rank's row (and its whole start facts, a real model's parameter layout among them) for each slot
cost a settle seconds."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.postgres.aggregates import ArrayAgg
from django.db.models import Q
from django.db.models.functions import Now

from dashboard.detection.rules import RANK_FACTS
from dashboard.tenancy import facts
from dashboard.tenancy.models import Rank, Run, rank_ended


@dataclass(frozen=True)
class RankState:
    """Where the ranks are for one compile slot.

    A rank that completed the step a compile happened in, without reporting that compile, did
    not compile it: its events arrive in order, so the compile would have come before that
    step's gradients. A rank that is still before that step (compiling, or just slow) is not
    judged yet; one that stopped reporting altogether is rank_silent's business.
    """

    accountable: set[int]  # ranks whose absence from the slot means 'did not do it', not 'no data (yet)'
    pending: set[int]  # live ranks, reporting lately, not past the slot: they may still report it

    def behind(self, reported: set[int]) -> set[int]:
        """Live ranks that may still report the slot: worth waiting for."""
        return self.pending - reported


def rank_state(run: Run, step: int | None, since: datetime, silent_after: float) -> RankState:
    """`step`: the slot's (None: a compile outside the training steps, where anything sent since the
    slot opened counts as passing it). A lost rank never said goodbye: its absence is no data."""
    passed = Q(last_step__gte=step) if step is not None else Q(last_seen__gte=since)
    ended = rank_ended()
    fresh = Q(last_seen__gt=Now() - timedelta(seconds=silent_after))
    row = Rank.objects.filter(run=run).aggregate(
        accountable=ArrayAgg("rank", filter=passed | ended, default=[]),
        pending=ArrayAgg("rank", filter=~passed & ~ended & fresh, default=[]),
    )
    return RankState(accountable=set(row["accountable"]), pending=set(row["pending"]))


OWN = ("host", "device")  # start facts that differ from rank to rank (a node's, a GPU's): plain columns


def start_facts(run: Run) -> dict[int, dict[str, Any]]:
    """rank -> the start facts the compile rules read (`rules.RANK_FACTS`), never the model's parameter
    layout: what the ranks share decoded once per group of them (`tenancy.facts`), each rank's host and
    device from its row. Every rank's facts as JSON cost 3 s at 100,000 ranks."""
    out: dict[int, dict[str, Any]] = {}
    for shared, ranks, hosts, devices in facts.groups(run.id, [k for k in RANK_FACTS if k not in OWN]):
        common = {k: v for k, v in shared.items() if v is not None}
        for rank, host, device in zip(ranks, hosts, devices, strict=True):
            own = out[rank] = common.copy()
            if host:
                own["host"] = host
            if device:
                own["device"] = device
    return out
