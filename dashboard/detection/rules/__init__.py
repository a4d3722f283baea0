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
import math
import pkgutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property, wraps
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from dashboard.detection.consensus import Consensus, consensus
from dashboard.detection.text import ranks_text as ranks_text  # every rule names ranks through it: ranges, bounded

if TYPE_CHECKING:  # the views' types only: the rules never read the database
    from dashboard.evidence.reads import CompileReport, GradRow

# Severities: "critical", "warning", and information (a cache hit/miss race): it explains the
# incident it joins and never opens one, leads one or keeps one open, so it never pages.
INFO = "info"


@dataclass(frozen=True)
class Finding:
    """A rule's verdict on one slot; the alert's identity is (run, kind, subject). `kind` and a
    declared `subject` are filled in by `@rule`."""

    severity: str
    ranks: tuple[int, ...]
    message: str
    step: int | None = None
    frame: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    subject: str = ""
    kind: str = ""


# The start facts (rank_start's `info`) the compile rules read; only these are loaded for a slot
# (`detection.ranks.start_facts`): a rule that reads another key adds it here.
RANK_FACTS = ("host", "device", "settings", "env", "codegen", "cache_dirs", "cache_fs", "collective_timeout_s")


@dataclass
class CompileSlotView:
    """A settled compile slot: every rank's report plus who should have reported."""

    frame: str
    index: int
    reports: dict[int, CompileReport]  # rank -> its compile, one object for ranks alike (`reads.compile_reports`)
    accountable: set[int]  # ranks whose silence means "did not compile this"
    world_size: int
    rank_info: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its `RANK_FACTS`, shared where alike
    graph_breaks: list[tuple[int, str]] = field(default_factory=list)  # (rank, reason) of this frame
    times: dict[int, float] = field(default_factory=dict)  # rank -> its compile's seconds, where it sent them

    @cached_property
    def alike(self) -> list[tuple[list[int], CompileReport]]:
        """Each report once, with its ranks: what a rule derives from a report is derived once for all
        the ranks that compiled alike, not 100,000 times."""
        by_report: dict[int, tuple[list[int], CompileReport]] = {}
        for rank, report in self.reports.items():
            by_report.setdefault(id(report), ([], report))[0].append(rank)
        return list(by_report.values())


@dataclass
class GradSlotView:
    """A settled gradient (or weight) slot: every rank's bucket fingerprints and their consensus."""

    step: int
    group: str
    reports: dict[int, GradRow]
    consensus: Consensus[tuple[int, ...]] | None  # of the ranks' fingerprints
    world_size: int
    baseline: tuple[int, ...] | None = None  # the baseline run's consensus for the same step and group
    baseline_key: str | None = None
    rank_info: dict[int, dict[str, Any]] = field(
        default_factory=dict
    )  # rank -> rank_start facts (the parameters' names and buckets)
    nonfinite_losses: dict[int, int] = field(default_factory=dict)  # rank -> first step of a NaN/inf loss, read where
    # every rank's gradients are non-finite (whose loss went first)


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


class CompileFacts(TypedDict):
    """A rank's last compile before it ended (`runs.crash_facts`)."""

    frame: str
    index: int
    step: int | None
    status: str
    cache: dict[str, str]  # stage -> its cache outcome(s)
    cache_keys: dict[str, str]  # stage -> its cache key
    seconds_before_end: float


class Crash(TypedDict):
    """How a rank ended badly (`runs.crash_facts`): the rank row's status and exit code, the exception
    of its rank_end, and its last compile."""

    status: str
    exit_code: int | None
    reason: str | None
    exc_type: str | None
    where: str | None
    ended_at: float
    last_step: int | None
    last_compile: CompileFacts | None


@dataclass(frozen=True)
class Liveness:
    """How lately a run's ranks reported, in counts and extremes plus the few ranks worth naming: a
    sweep looks every second, and at 100,000 ranks reading every rank's age cost it most of that.

    `quiet` holds the ages of the live ranks quiet for the view's `watch_after` or more (no shorter
    than the silent and lost thresholds, so every rank a liveness rule could name is in it) and of
    the ranks whose silence alert is open (to resolve it once they report again)."""

    reported: int  # ranks that ever reported
    ended: set[int]  # ranks that ended (every one: few while a job runs)
    quiet: dict[int, float]  # rank -> seconds since its last report, for the ranks above
    freshest: float  # seconds since the latest report of any rank (inf: none)
    freshest_live: float  # ... of a rank that has not ended (inf: none)
    oldest_end: float | None  # seconds since the last report of the ended rank quiet longest (None: none ended)

    @property
    def live(self) -> int:
        return self.reported - len(self.ended)


@dataclass
class RunView:
    """A run's ranks as the periodic sweep sees them (for rules about liveness and totals)."""

    run_id: int
    world_size: int
    ranks: Liveness
    silent_after: float
    crashes: dict[int, Crash] = field(default_factory=dict)  # rank -> how it ended badly (`runs.crash_facts`)
    progress: dict[int, RankProgress] = field(default_factory=dict)  # ranks that sampled recently
    collective_timeout_s: float | None = None
    hang_warn_after: float = 10.0
    lost_after: float = 12.0  # a rank left running alone this long after its peers ended is lost
    grace: float = 20.0  # how long consequences (a lost peer, a stop by signal) wait for their root
    now: float = 0.0  # the sweep's clock (epoch seconds), for crash times
    since_shed: float = math.inf  # seconds since ingest last turned batches away for load (`ingest.shed`)
    compile_cost: dict[str, Any] | None = None  # the kept compile bill against its budget (`bills.for_sweep`)


@dataclass(frozen=True)
class RankWork:
    """What one rank's compiles of a run hold (`runs.compiled_work`)."""

    graphs: int  # compiles whose graph holds ops: work that runs compiled
    empty: int  # compiles that succeeded with an empty graph (a wrapper frame, or nothing to compile)
    first_step: int | None  # the step of the rank's first compile
    empty_frames: tuple[str, ...] = ()  # a few of the empty frames, for the message


@dataclass
class CompiledWorkView:
    """A run's compiled work per rank, as the sweep sees it while the run goes and once after it ended:
    a rank's compiles are known in full only once it finished the step they started in."""

    run_id: int
    work: dict[int, RankWork]  # for the ranks with an empty compile
    last_step: dict[int, int | None]  # rank -> its last completed step (None before the first), as the
    # aggregates of `work` saw it (`runs.compiled_work`)
    ended: set[int]

    def known(self, rank: int) -> bool:
        """The rank's compiles of its first compiled step are all in: it finished a later step, or ended."""
        last, first = self.last_step.get(rank), self.work[rank].first_step
        return rank in self.ended or (last is not None and first is not None and last > first)


@dataclass(frozen=True)
class Rule:
    kind: str
    view: type
    check: Callable[[Any], Iterable[Finding]]  # takes a `view`
    subject: Callable[[Any], str | list[str]] | None = None


REGISTRY: list[Rule] = []
V = TypeVar("V")  # the view a rule checks


def rule(
    kind: str, view: type[V], subject: Callable[[V], str | list[str]] | None = None
) -> Callable[[Callable[[V], Iterable[Finding] | None]], Callable[[V], Iterator[Finding]]]:
    def register(fn: Callable[[V], Iterable[Finding] | None]) -> Callable[[V], Iterator[Finding]]:
        @wraps(fn)
        def check(v: V) -> Iterator[Finding]:
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


def clean_subjects(view: object, findings: list[Finding]) -> set[tuple[str, str]]:
    """(kind, subject) pairs this view checked and found healthy: their alerts may resolve. A set,
    unordered: a sweep of 100,000 ranks checks a subject per rank and rule, and sorting them cost it
    more than the check."""
    fired = {(f.kind, f.subject) for f in findings}
    checked: set[tuple[str, str]] = set()
    for r in rules_for(view):
        subjects = r.subject(view) if r.subject is not None else []
        checked.update((r.kind, s) for s in ([subjects] if isinstance(subjects, str) else subjects))
    return checked - fired


def position(view: object) -> int:
    """Where a view sits in its subject's history: resolution only moves forward."""
    return view.step if isinstance(view, GradSlotView) else getattr(view, "index", 0)


def load_all() -> None:
    """Import every rule module once so each registers itself."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


COMPILER_ENV = ("TORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_")  # the variables torch's compiler reads
PLACES = ("_DIR", "_PATH", "_FILE")  # where a cache or a dump goes: not how code is compiled


def compiler_settings(info: Mapping[str, Any]) -> dict[str, str]:
    """A rank's non-default compiler settings, and the compiler's variables in its environment: torch
    reads some of them at import into a setting's default (TORCHINDUCTOR_SIZE_ASSERTS=0), where the
    settings alone cannot tell them from torch's own."""
    found = {str(k): str(v) for k, v in (info.get("settings") or {}).items()}
    env = info.get("env") or {}
    found.update({f"env.{k}": str(v) for k, v in env.items() if k.startswith(COMPILER_ENV) and not k.endswith(PLACES)})
    return found


def settings_split(view: CompileSlotView) -> tuple[str, dict[str, dict[str, str]]]:
    """How the compiler settings of the slot's ranks differ ("rank 1 runs with
    `inductor.triton.cudagraphs=False`"), and per key the ranks' values; ("", {}) when they agree.
    A setting a rank did not report is at torch's default; a variable it did not have is unset."""
    infos = {r: view.rank_info.get(r) or {} for r in view.reports}
    settings = {r: compiler_settings(info) for r, info in infos.items()}
    keys = sorted(set().union(*settings.values())) if settings else []
    parts: list[str] = []
    split: dict[str, dict[str, str]] = {}
    for key in keys:
        absent = "unset" if key.startswith("env.") else "default"
        values = {r: s.get(key, absent) for r, s in settings.items()}
        verdict = consensus(values)
        if not verdict.dissenters:
            continue
        split[key] = {str(r): v for r, v in sorted(values.items())}
        by_value: dict[str, list[int]] = {}
        for r in verdict.dissenters:
            by_value.setdefault(values[r], []).append(r)
        parts += [
            f"{ranks_text(rs)} {'runs' if len(rs) == 1 else 'run'} with `{key}={v}`" for v, rs in by_value.items()
        ]
    return "; ".join(parts), split


def with_settings(message: str, view: CompileSlotView) -> tuple[str, dict[str, Any]]:
    """`message`, plus how the ranks' compiler settings differ when they do (and the details key)."""
    text, split = settings_split(view)
    return (f"{message} ({text})" if text else message), ({"settings": split} if split else {})


def differing_buckets(view: GradSlotView) -> list[int]:
    """Bucket indices where some dissenting rank differs from the reference fingerprints."""
    assert view.consensus is not None  # only slots with a consensus have dissenters
    reference = view.consensus.reference
    return sorted(
        {i for r in view.consensus.dissenters for i, (a, b) in enumerate(zip(view.reports[r].fps, reference)) if a != b}
    )


PARAMS_SHOWN = 5  # parameters a message names; the alert's details hold them all


def bucket_params(view: GradSlotView, buckets: list[int]) -> list[str]:
    """The parameters (module paths) the buckets hold, in module order, from the layout a reference rank
    reported at its start (`params` are "group:name", `buckets` index lists into them, each group's in
    order); [] when no rank reported one."""
    group = view.group.removeprefix("param:")
    dissenters = set(view.consensus.dissenters) if view.consensus else set()
    ranks = sorted(view.rank_info, key=lambda r: (r in dissenters, r))
    info = next((view.rank_info[r] for r in ranks if (view.rank_info[r] or {}).get("buckets")), None) or {}
    params, layout, prefix = info.get("params") or [], info.get("buckets") or [], f"{group}:"
    mine = [b for b in layout if b and all(0 <= i < len(params) for i in b) and params[b[0]].startswith(prefix)]
    held = sorted(i for k in buckets if 0 <= k < len(mine) for i in mine[k])
    return [params[i][len(prefix) :] for i in held]


def where_text(view: GradSlotView, buckets: list[int]) -> str:
    """ "in layer1.weight, layer1.bias, … (+3 more)" from the layout, or "in buckets 1, 2" without one."""
    names = bucket_params(view, buckets)
    if not names:
        return f"in buckets {', '.join(map(str, buckets))}"
    more = f", … (+{len(names) - PARAMS_SHOWN} more)" if len(names) > PARAMS_SHOWN else ""
    return "in " + ", ".join(module_path(n) for n in names[:PARAMS_SHOWN]) + more


def module_path(name: str) -> str:
    """A parameter's name as the user's model spells it: torch.compile's wrapper adds `_orig_mod.`."""
    return name.replace("_orig_mod.", "")


def outcome_of(values: str | None) -> str | None:
    """'hit' only if every lookup hit; the agent joins several lookups of a stage with commas."""
    parts = [v for v in (values or "").split(",") if v]
    if not parts:
        return None
    return "hit" if all(v == "hit" for v in parts) else "miss" if "miss" in parts else parts[0]


def cache_outcome(cache: Mapping[str, str], stage: str) -> str | None:
    """The stage's outcome (`outcome_of`) in a compile's cache report."""
    return outcome_of(cache.get(stage))


def compile_outcome(cache: Mapping[str, str]) -> str | None:
    """The Inductor (FX graph) cache outcome of a compile, or AOTAutograd's where Inductor reported none."""
    return cache_outcome(cache, "inductor") or cache_outcome(cache, "aotautograd")


def cache_key(keys: Mapping[str, str]) -> str:
    """The Inductor (FX graph) cache key of a compile, or AOTAutograd's where Inductor reported none."""
    return keys.get("inductor") or keys.get("aotautograd") or ""


def short_key(key: str) -> str:
    """Cache keys are 52 characters; 12 tell them apart in a message (each graph's of a joined key)."""
    return ",".join(part[:12] + ("…" if len(part) > 12 else "") for part in key.split(","))


def first_step(reports: Mapping[int, CompileReport], ranks: Iterable[int]) -> int | None:
    return min((step for r in ranks if (step := reports[r].step) is not None), default=None)
