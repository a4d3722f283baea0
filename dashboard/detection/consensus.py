"""Majority value of one slot and the ranks that dissent from it (docs/design.md, Detection)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

SHOWN = 8  # ranks a split without majority names


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


def at_fault(verdict: Consensus, ranks: Iterable[int]) -> tuple[int, ...]:
    """The ranks a finding names: the dissenters, or every compared rank where no majority says which
    is off (two ranks that differ: blaming the higher one only because it is not the lowest is a guess)."""
    return tuple(sorted(ranks)) if verdict.tie else verdict.dissenters


def disagree_text(ranks: Iterable[int]) -> str:
    """ "ranks 0 and 1 disagree"; a larger split names its first few ranks and how many there are."""
    names = [str(r) for r in sorted(ranks)]
    if len(names) <= 2:
        return f"ranks {' and '.join(names)} disagree"
    shown = ", ".join(names[:SHOWN]) + (", …" if len(names) > SHOWN else "")
    return f"the {len(names)} ranks {shown} disagree with no majority"
