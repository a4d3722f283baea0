"""A run's verdict: what became of it in one word and one line, decided here once for the pages,
the API, the CLI and /metrics, so a team browsing yesterday's runs sees which went wrong and why.

- diverged at step N (root ranks, kind), failed (rank, error) or stalled: an incident still counts
  (firing, or the run ended before it got better); the most severe, then the earliest, decides, by
  its root's kind (a crash or a lost rank failed the run; a quiet rank or a forecast hang stalled it;
  anything else diverged it). What a compile costs is no verdict: such a run is still in lockstep.
- failed or stalled by the run's status alone, where no incident says more.
- recovered: it had incidents, and every one got better (or a person closed it).
- in lockstep: nothing went wrong.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dashboard.detection import incidents as grouping
from dashboard.detection.models import Incident
from dashboard.tenancy.models import Run

VERDICTS = ("in_lockstep", "diverged", "failed", "stalled", "recovered")
COST_ONLY = frozenset({"compile_cost", "recompile_storm", "ineffective_compile", "compile_straggler"})
STALLS = frozenset({"hang_forecast"})
_SEVERITY = {"critical": 0, "warning": 1}
MAX_ERROR = 160
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

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "text": self.text,
            "step": self.step,
            "ranks": list(self.ranks),
            "cause": self.cause,
            "incident": self.incident,
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
        return _named(min(counting, key=lambda i: (_SEVERITY.get(i.severity, 2), i.opened_at, i.id)))
    if status in ("failed", "stalled"):
        crash = next((i for i in telling if _kind_of(i) == status), None)
        return _named(crash) if crash else Verdict(status, status)
    if telling:
        return Verdict("recovered", f"recovered ({_count(len(telling))}, all resolved)")
    return Verdict("in_lockstep", "in lockstep")


def _named(incident: Incident) -> Verdict:
    root = incident.root
    assert root is not None
    kind, ranks = _kind_of(incident), tuple(sorted(root.ranks))
    who = f"rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))}" if ranks else "all ranks"
    if kind == "failed":
        text = f"failed ({who}, {_error(root.kind, root.details or {}, root.message)})"
    else:
        at = f" at step {root.step}" if root.step is not None else ""
        text = f"{kind}{at} ({who}, {root.kind})"
    return Verdict(kind, text, root.step, ranks, root.kind, incident.id)


def _kind_of(incident: Incident) -> str:
    root = incident.root
    assert root is not None
    if root.kind == "rank_crashed" or (root.kind == "rank_silent" and (root.details or {}).get("lost")):
        return "failed"
    if root.kind == "rank_silent" or root.kind in STALLS:
        return "stalled"
    return "diverged"


def _error(kind: str, details: dict[str, Any], message: str) -> str:
    """The error in a few words: the exception's first line, how the rank was stopped, or the message."""
    if kind == "rank_silent":
        return "lost: never ended"
    text = details.get("reason") or details.get("exc_type") or message
    first = str(text).strip().splitlines()[0] if str(text).strip() else message
    return first if len(first) <= MAX_ERROR else first[: MAX_ERROR - 1] + "…"


def _count(n: int) -> str:
    return f"{n} incident{'s' if n != 1 else ''}"
