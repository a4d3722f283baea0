"""Majority value of one slot and the ranks that dissent from it (docs/design.md, Detection)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Consensus:
    reference: Hashable
    dissenters: tuple[int, ...]
    tie: bool  # no strict majority: the lowest rank's value is the reference


def consensus(values: Mapping[int, Hashable]) -> Consensus:
    """Strict majority wins; otherwise (2 ranks, or a split) the lowest rank's value is the reference."""
    if not values:
        raise ValueError("consensus of no ranks")
    value, count = Counter(values.values()).most_common(1)[0]
    tie = count * 2 <= len(values)
    if tie:
        value = values[min(values)]
    dissenters = tuple(sorted(rank for rank, v in values.items() if v != value))
    return Consensus(reference=value, dissenters=dissenters, tie=tie and bool(dissenters))
