"""A run's verdict: what became of it in one word and one line, decided here once for the pages,
the API, the CLI and /metrics, so a team browsing yesterday's runs sees which went wrong and why.

- diverged at step N (root ranks, kind), failed at step N (rank, error) or stalled: an incident still
  counts (firing, or the run ended before it got better); the worst decides, by its root's kind (a
  crash or a lost rank failed the run; a quiet rank or a forecast hang stalled it; anything else
  diverged it): a dead, crashed or silent rank first (what a paged engineer must see before a
  divergence), then the most severe, then the earliest. The others are named after it in step order
  ("; 2 more: ..."), so a run with several causes never reads as one. What a compile costs is no
  verdict: such a run is still in lockstep.
- failed or stalled by the run's status alone, where no incident says more.
- recovered: it had incidents, and every one got better (or a person closed it).
- in lockstep: nothing went wrong.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from dashboard.detection import incidents as grouping
from dashboard.detection.models import Alert, Incident
from dashboard.tenancy.models import VANISHED, Run

VERDICTS = ("in_lockstep", "diverged", "failed", "stalled", "recovered")
COST_ONLY = frozenset({"compile_cost", "recompile_storm", "ineffective_compile", "compile_straggler"})
STALLS = frozenset({"hang_forecast"})
_SEVERITY = {"critical": 0, "warning": 1}
DEAD = frozenset({"rank_crashed", "rank_silent"})  # a rank that stopped outranks any divergence
_OUTCOMES = ("failed", "stalled", "diverged")  # worst first, at one severity
MAX_ERROR = 160
MORE_NAMED = 3  # other incidents named after the worst; beyond these only counted
READ = ("run_id", "state", "severity", "opened_at", "root_id")  # what a verdict reads of an incident
ROOT_READ = ("kind", "ranks", "step", "message", "details")  # and of its root alert


@dataclass(frozen=True)
class Verdict:
    kind: str  # one of VERDICTS
    text: str  # "diverged at step 12 (rank 1, grad_divergence)"
    step: int | None = None
    ranks: tuple[int, ...] = ()
    cause: str | None = None  # the root alert's kind
    incident: int | None = None
    more: int = 0  # other unresolved incidents, named after the worst in `text`

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "text": self.text,
            "step": self.step,
            "ranks": list(self.ranks),
            "cause": self.cause,
            "incident": self.incident,
            "more": self.more,
        }


def of_runs(runs: Iterable[Run]) -> dict[int, Verdict]:
    """run id -> verdict, for runs annotated with their status (`with_status`): one query for all."""
    found = list(runs)
    by_run: dict[int, list[Incident]] = {run.id: [] for run in found}
    found_incidents = (
        Incident.objects.filter(run_id__in=list(by_run))
        .select_related("root")
        .only(*READ, *(f"root__{field}" for field in ROOT_READ))
        .order_by("opened_at", "id")
    )
    for incident in found_incidents:
        by_run[incident.run_id].append(incident)
    return {run.id: decide(run.status, by_run[run.id]) for run in found}


def of_run(run: Run) -> Verdict:
    return of_runs([run])[run.id]


def decide(status: str, found: list[Incident]) -> Verdict:
    """The verdict of a run of `status` with these incidents (oldest first)."""
    telling = [i for i in found if i.root is not None and i.root.kind not in COST_ONLY]
    counting = [i for i in telling if grouping.unresolved(i)]
    if counting:
        worst = min(counting, key=_worst_first)
        return _with_more(_named(worst), [i for i in counting if i is not worst])
    if status in ("failed", "stalled"):
        crash = next((i for i in telling if _kind_of(i) == status), None)
        return _named(crash) if crash else Verdict(status, status)
    if telling:
        return Verdict("recovered", f"recovered ({_count(len(telling))}, all resolved)")
    return Verdict("in_lockstep", "in lockstep")


def _worst_first(incident: Incident) -> tuple[Any, ...]:
    """Sort key: a dead rank, then severity, then failed / stalled / diverged, then the earliest."""
    dead = 0 if _root(incident).kind in DEAD else 1
    severity = _SEVERITY.get(incident.severity, 2)
    return (dead, severity, _OUTCOMES.index(_kind_of(incident)), incident.opened_at, incident.id)


def _in_steps(incident: Incident) -> tuple[Any, ...]:
    """Sort key: by root step (none last), then the earliest: how the run page lists incidents."""
    step = _root(incident).step
    return (step is None, step or 0, incident.opened_at, incident.id)


def _named(incident: Incident) -> Verdict:
    root = _root(incident)
    kind, ranks = _kind_of(incident), tuple(sorted(root.ranks))
    detail = _error(root.kind, root.details or {}, root.message) if kind == "failed" else root.kind
    text = f"{kind}{_at(root.step)} ({_who(ranks)}, {detail})"
    return Verdict(kind, text, root.step, ranks, root.kind, incident.id)


def _with_more(worst: Verdict, others: list[Incident]) -> Verdict:
    """`worst`, its text followed by the other incidents in step order (MORE_NAMED of them by name)."""
    if not others:
        return worst
    roots = [_root(i) for i in sorted(others, key=_in_steps)[:MORE_NAMED]]
    named = ", ".join(f"{r.kind}{_at(r.step)} ({_who(tuple(sorted(r.ranks)))})" for r in roots)
    rest = ", …" if len(others) > MORE_NAMED else ""
    return replace(worst, text=f"{worst.text}; {len(others)} more: {named}{rest}", more=len(others))


def _at(step: int | None) -> str:
    return f" at step {step}" if step is not None else ""


def _who(ranks: tuple[int, ...]) -> str:
    return f"rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))}" if ranks else "all ranks"


def _root(incident: Incident) -> Alert:
    assert incident.root is not None  # `decide` reads only incidents with a root
    return incident.root


def _kind_of(incident: Incident) -> str:
    root = _root(incident)
    if root.kind == "rank_crashed" or (root.kind == "rank_silent" and (root.details or {}).get("lost")):
        return "failed"
    if root.kind == "rank_silent" or root.kind in STALLS:
        return "stalled"
    return "diverged"


def _error(kind: str, details: dict[str, Any], message: str) -> str:
    """The error in a few words: the exception's first line, how the rank was stopped, or the message."""
    if kind == "rank_silent":
        return "lost: never ended"
    if details.get("status") == VANISHED:
        return "vanished: killed or crashed in native code"
    text = details.get("reason") or details.get("exc_type") or message
    first = str(text).strip().splitlines()[0] if str(text).strip() else message
    return first if len(first) <= MAX_ERROR else first[: MAX_ERROR - 1] + "…"


def _count(n: int) -> str:
    return f"{n} incident{'s' if n != 1 else ''}"
