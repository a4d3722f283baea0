"""The alert rules, registered in one place.

A rule is a function of one settled slot returning findings; it lives in its own module in
this package and registers itself with `@rule`. Adding a rule means adding one module.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Callable, Iterable

from dashboard.detection.consensus import Consensus


@dataclass(frozen=True)
class Finding:
    """A rule's verdict on one slot; the alert's identity is (run, kind, subject)."""

    kind: str
    severity: str
    subject: str
    ranks: tuple[int, ...]
    message: str
    step: int | None = None
    frame: str | None = None
    details: dict = field(default_factory=dict)


@dataclass
class CompileSlotView:
    """A settled compile slot: every rank's report plus who should have reported."""

    frame: str
    index: int
    reports: dict  # rank -> ingest.models.CompileEvent
    accountable: set[int]  # ranks whose silence means "did not compile this"
    world_size: int


@dataclass
class GradSlotView:
    step: int
    group: str
    reports: dict  # rank -> ingest.models.GradReport
    consensus: Consensus | None
    world_size: int


Rule = Callable[[object], Iterable[Finding]]
REGISTRY: dict[type, list[tuple[str, Rule]]] = {CompileSlotView: [], GradSlotView: []}


def rule(kind: str, slot: type) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        REGISTRY[slot].append((kind, fn))
        return fn

    return register


def evaluate(view: CompileSlotView | GradSlotView) -> list[Finding]:
    return [finding for _, fn in REGISTRY[type(view)] for finding in fn(view)]


def load_all() -> None:
    """Import every rule module once so each registers itself."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


def ranks_text(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
