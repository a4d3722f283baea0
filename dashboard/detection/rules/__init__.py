"""The alert rules, registered in one place.

A rule is a function of one settled slot (or of a run, for the periodic rules) returning
findings. Each lives in its own module of this package and registers itself with `@rule`;
adding a rule means adding one module. The decorator stamps every finding with the rule's kind
and, unless the finding names its own, the subject the rule declares (`subjects`), so both are
spelled once. A declared subject also lets the engine resolve the alert when a later slot of
the same subject comes out clean.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field, replace
from functools import wraps
from typing import Callable, Iterable, Iterator

from dashboard.detection.consensus import Consensus, consensus


@dataclass(frozen=True)
class Finding:
    """A rule's verdict on one slot; the alert's identity is (run, kind, subject). `kind` and a
    declared `subject` are filled in by `@rule`."""

    severity: str
    ranks: tuple[int, ...]
    message: str
    step: int | None = None
    frame: str | None = None
    details: dict = field(default_factory=dict)
    subject: str = ""
    kind: str = ""


@dataclass
class CompileSlotView:
    """A settled compile slot: every rank's report plus who should have reported."""

    frame: str
    index: int
    reports: dict  # rank -> ingest.models.CompileEvent
    accountable: set[int]  # ranks whose silence means "did not compile this"
    world_size: int
    rank_info: dict = field(default_factory=dict)  # rank -> rank_start facts (cache_dirs, collective timeout)
    graph_breaks: list = field(default_factory=list)  # (rank, reason) of this frame


@dataclass
class GradSlotView:
    """A settled gradient (or weight) slot: every rank's bucket fingerprints and their consensus."""

    step: int
    group: str
    reports: dict  # rank -> dashboard.detection.evidence.GradRow
    consensus: Consensus | None
    world_size: int
    baseline: tuple | None = None  # the baseline run's consensus for the same step and group
    baseline_key: str | None = None


@dataclass(frozen=True)
class RankProgress:
    """A rank's latest progress sample (`protocol.Progress`), its clocks carried forward to now."""

    phase: str
    phase_s: float  # in the phase, up to now
    step: int | None
    since_step_s: float | None
    where: str = ""
    op: str = ""
    reason: str = ""


@dataclass
class RunView:
    """A run's ranks as the periodic sweep sees them (for rules about liveness and totals)."""

    run_id: int
    world_size: int
    last_seen: dict  # rank -> seconds since the rank's last report
    ended: set[int]
    silent_after: float
    compile_seconds: float = 0.0
    wall_seconds: float = 0.0
    crashes: dict = field(default_factory=dict)  # rank -> how it ended badly (`runs.crash_facts`)
    progress: dict = field(default_factory=dict)  # rank -> RankProgress, ranks that sampled recently
    collective_timeout_s: float | None = None
    hang_warn_after: float = 10.0


@dataclass(frozen=True)
class Rule:
    kind: str
    view: type
    check: Callable[[object], Iterable[Finding]]
    subject: Callable[[object], str | list[str]] | None = None


REGISTRY: list[Rule] = []


def rule(kind: str, view: type, subject: Callable[[object], str | list[str]] | None = None):
    def register(fn: Callable[[object], Iterable[Finding]]):
        @wraps(fn)
        def check(v: object) -> Iterator[Finding]:
            declared = subject(v) if subject is not None else None
            for finding in fn(v) or ():
                named = finding.subject or (declared if isinstance(declared, str) else "")
                if not named:
                    raise ValueError(f"rule {kind} found something without a subject")
                yield replace(finding, kind=kind, subject=named)

        REGISTRY.append(Rule(kind, view, check, subject))
        return check

    return register


def rules_for(view: object) -> list[Rule]:
    return [r for r in REGISTRY if isinstance(view, r.view)]


def evaluate(view: object) -> list[Finding]:
    return [finding for r in rules_for(view) for finding in r.check(view)]


def clean_subjects(view: object, findings: list[Finding]) -> list[tuple[str, str]]:
    """(kind, subject) pairs this view checked and found healthy: their alerts may resolve."""
    fired = {(f.kind, f.subject) for f in findings}
    checked = set()
    for r in rules_for(view):
        subjects = r.subject(view) if r.subject is not None else []
        checked |= {(r.kind, s) for s in ([subjects] if isinstance(subjects, str) else subjects)}
    return sorted(checked - fired)


def position(view: object) -> int:
    """Where a view sits in its subject's history: resolution only moves forward."""
    return getattr(view, "step", None) if isinstance(view, GradSlotView) else getattr(view, "index", 0)


def load_all() -> None:
    """Import every rule module once so each registers itself."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


def ranks_text(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def settings_split(view: CompileSlotView) -> tuple[str, dict[str, dict[str, str]]]:
    """How the compiler settings of the slot's ranks differ ("rank 1 runs with
    `inductor.triton.cudagraphs=False`"), and per key the ranks' values; ("", {}) when they agree.
    A setting a rank did not report is at torch's default."""
    infos = {r: view.rank_info.get(r) or {} for r in view.reports}
    settings = {r: info.get("settings") or {} for r, info in infos.items()}
    keys = sorted(set().union(*settings.values())) if settings else []
    parts, split = [], {}
    for key in keys:
        values = {r: str(s.get(key, "default")) for r, s in settings.items()}
        verdict = consensus(values)
        if not verdict.dissenters:
            continue
        split[key] = {str(r): v for r, v in sorted(values.items())}
        by_value: dict[str, list[int]] = {}
        for r in verdict.dissenters:
            by_value.setdefault(values[r], []).append(r)
        parts += [f"{ranks_text(rs)} {'runs' if len(rs) == 1 else 'run'} with `{key}={v}`" for v, rs in by_value.items()]
    return "; ".join(parts), split


def with_settings(message: str, view: CompileSlotView) -> tuple[str, dict]:
    """`message`, plus how the ranks' compiler settings differ when they do (and the details key)."""
    text, split = settings_split(view)
    return (f"{message} ({text})" if text else message), ({"settings": split} if split else {})


def differing_buckets(view: GradSlotView) -> list[int]:
    """Bucket indices where some dissenting rank differs from the reference fingerprints."""
    reference = view.consensus.reference
    return sorted({i for r in view.consensus.dissenters
                   for i, (a, b) in enumerate(zip(view.reports[r].fps, reference)) if a != b})


def cache_outcome(cache: dict, stage: str) -> str | None:
    """'hit' only if every lookup of the stage hit; the agent joins several lookups with commas."""
    values = [v for v in (cache.get(stage) or "").split(",") if v]
    if not values:
        return None
    return "hit" if all(v == "hit" for v in values) else "miss" if "miss" in values else values[0]


def compile_outcome(cache: dict) -> str | None:
    """The Inductor (FX graph) cache outcome of a compile, or AOTAutograd's where Inductor reported none."""
    return cache_outcome(cache, "inductor") or cache_outcome(cache, "aotautograd")


def cache_key(keys: dict) -> str:
    """The Inductor (FX graph) cache key of a compile, or AOTAutograd's where Inductor reported none."""
    return keys.get("inductor") or keys.get("aotautograd") or ""


def short_key(key: str) -> str:
    """Cache keys are 52 characters; 12 tell them apart in a message (each graph's of a joined key)."""
    return ",".join(part[:12] + ("…" if len(part) > 12 else "") for part in key.split(","))


def first_step(reports: dict, ranks: Iterable[int]) -> int | None:
    return min((reports[r].step for r in ranks if reports[r].step is not None), default=None)
