"""Majority value of one slot and the ranks that dissent from it (docs/design.md, Detection)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from dashboard.detection.text import ranks_text

H = TypeVar("H", bound=Hashable)  # the compared value: a hash, a tuple of fingerprints, a schedule


@dataclass(frozen=True)
class Consensus(Generic[H]):
    reference: H
    dissenters: tuple[int, ...]
    tie: bool  # no strict majority: the lowest rank's value is the reference


def consensus(values: Mapping[int, H]) -> Consensus[H]:
    """Strict majority wins; otherwise (2 ranks, or a split) the lowest rank's value is the reference."""
    ranks_of: dict[H, list[int]] = {}
    for rank, value in values.items():
        ranks_of.setdefault(value, []).append(rank)
    return _verdict(ranks_of)


def consensus_of_groups(groups: Iterable[tuple[Iterable[int], H]]) -> Consensus[H]:
    """`consensus` of ranks given as stored agreement, each group a value and the ranks that reported it
    (a rank in one group only): counted a group at a time, not a rank at a time. At 100,000 ranks a
    grad slot is a few hundred stored rows, and counting each rank's fingerprints was a third of its
    settle."""
    ranks_of: dict[H, list[int]] = {}
    for ranks, value in groups:
        ranks_of.setdefault(value, []).extend(ranks)
    return _verdict(ranks_of)


def _verdict(ranks_of: dict[H, list[int]]) -> Consensus[H]:
    """The verdict on each value's ranks: a strict majority, else the lowest rank's value."""
    if not ranks_of:
        raise ValueError("consensus of no ranks")
    total = sum(len(ranks) for ranks in ranks_of.values())
    value = max(ranks_of, key=lambda v: len(ranks_of[v]))
    tie = len(ranks_of[value]) * 2 <= total
    if tie:
        value = min(ranks_of.items(), key=lambda item: min(item[1]))[0]
    dissenters = tuple(sorted(r for v, ranks in ranks_of.items() if v != value for r in ranks))
    return Consensus(reference=value, dissenters=dissenters, tie=tie and bool(dissenters))


def at_fault(verdict: Consensus[H], ranks: Iterable[int]) -> tuple[int, ...]:
    """The ranks a finding names: the dissenters, or every compared rank where no majority says which
    is off (two ranks that differ: blaming the higher one only because it is not the lowest is a guess)."""
    return tuple(sorted(ranks)) if verdict.tie else verdict.dissenters


def changed_first(verdict: Consensus[H], steps: Mapping[int, int | None]) -> tuple[int, ...] | None:
    """With no majority, history names the rank at fault: the ranks that compiled the slot at an earlier
    step than the others changed first, while the others kept what they had then (two ranks, one takes
    a data-dependent branch at step N). None where the ranks compiled it in the same step: both changed,
    or their graphs differ from the start. `steps`: each compared rank's step of the slot."""
    if not verdict.tie or any(s is None for s in steps.values()) or len(set(steps.values())) < 2:
        return None
    first = min(s for s in steps.values() if s is not None)
    return tuple(sorted(r for r, s in steps.items() if s == first))


def disagree_text(ranks: Iterable[int]) -> str:
    """ "ranks 0 and 1 disagree"; a larger split names its ranks as ranges (`text.ranks_text`) and how
    many there are: "the 1024 ranks 0-1023 disagree with no majority"."""
    ranks = sorted(ranks)
    if len(ranks) <= 2:
        return f"ranks {' and '.join(map(str, ranks))} disagree"
    return f"the {len(ranks)} {ranks_text(ranks)} disagree with no majority"
