"""Incidents: alerts grouped by cause, and the only code that writes incidents.

An on-call engineer wants one page per cause, naming the rank where the trouble started. Rules
find symptoms, one alert each; this module decides which symptoms share a cause:

- An alert that says whose fault it is (`details["consequence_of"]`: a peer that lost its
  connection to a dead rank, a rank stopped by torchrun because another failed) joins the
  incident of that rank.
- A frame's follow-ups (the cache miss of a lone recompile, its compile cost, its storm) join an
  open incident that already holds an alert about the same frame and the same or more ranks.
- A symptom (the run's gradients against its baseline, replicas' gradients or weights, a straggling
  compile) and its cause (a rank's recompile or other graph at the same or an earlier step) share
  one incident whichever arrived first: a recompile reported 10 s after the baseline divergence it
  explains re-roots that incident (one page, updated) instead of opening a second. NaN gradients
  on one rank, spread to every rank by the next all-reduce, are likewise one incident, and so are
  ranks that all crash alike and the divergence of their gradients in the step before.
- Otherwise an alert joins the open incident of the same ranks (the dissenters: a rank that
  recompiled alone, then straggles, then holds other gradients is one story), or opens one.

Inside an incident the root is the most causal alert (`ROOT_ORDER`: a rank that died before the
peers that lost it, a recompile before its cache miss), the earliest first among equals. The
incident fires while any of its alerts fires, is as severe as the worst of them, and its
`revision` moves when the page should change (opened, grew, re-rooted, escalated, resolved,
acknowledged): delivery pages from that outbox, never from alerts.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from dashboard.detection import text
from dashboard.detection.models import Alert, Incident
from dashboard.detection.rules import INFO
from dashboard.tenancy.models import Run

if TYPE_CHECKING:
    from django.contrib.auth.models import User

# Most causal first. A kind missing here ranks after all of them.
ROOT_ORDER = (
    "rank_crashed",
    "rank_silent",
    "compile_failure_divergence",
    "graph_divergence",
    "recompile_divergence",
    "collective_schedule_divergence",
    "rank_specific_artifact",
    "compile_straggler",
    "nonfinite_grad",
    "grad_divergence",
    "param_divergence",
    "cache_divergence",
    "hang_forecast",
    "recompile_storm",
    "compile_cost",
    "ineffective_compile",
    "baseline_divergence",
)
FRAME_FOLLOWERS = frozenset(
    {"cache_divergence", "compile_cost", "recompile_storm", "compile_straggler", "hang_forecast"}
)
CAUSES = frozenset({"graph_divergence", "recompile_divergence"})  # a rank that compiled something else
SYMPTOMS = frozenset({"baseline_divergence", "grad_divergence", "param_divergence", "compile_straggler"})
NAN_SPREADS = frozenset({"grad_divergence", "param_divergence"})  # what NaN gradients on a rank make of it
_SEVERITY = {"warning": 1, "critical": 2}
RECOUNT_S = 30.0  # a page's counts are refreshed at most this often


def consequence_of(alert: Alert) -> int | None:
    """The rank whose failure this alert is a consequence of, where its rule knows one."""
    rank = (alert.details or {}).get("consequence_of")
    return rank if isinstance(rank, int) else None


def cause_ranks(alert: Alert) -> tuple[int, ...]:
    rank = consequence_of(alert)
    return (rank,) if rank is not None else tuple(sorted(alert.ranks))


def cause_of(alert: Alert) -> str:
    """The grouping key of the incident an alert opens: its ranks as ranges ("ranks:0-255"), cut to
    the column with a digest where even the ranges are too long (`text.fit_key`)."""
    ranks = cause_ranks(alert)
    key = "ranks:" + text.rank_ranges(ranks, sep=",") if ranks else f"{alert.kind}:{alert.subject}"
    return text.fit_key(Incident, "cause", key)


def precedence(alert: Alert) -> tuple[bool, int, float, float, int]:
    """Sort key of root candidates: a consequence never leads while another alert can; among alerts
    of one kind the earliest step leads (slots settle in any order), then the earliest seen."""
    kind = ROOT_ORDER.index(alert.kind) if alert.kind in ROOT_ORDER else len(ROOT_ORDER)
    follows = consequence_of(alert) is not None or alert.severity == INFO
    step = float("inf") if alert.step is None else alert.step
    return (follows, kind, step, alert.first_seen.timestamp(), alert.id)


def place(run: Run, alert_ids: Iterable[int]) -> list[int]:
    """Put changed alerts into incidents (in the caller's transaction); ids of incidents whose page changed."""
    assert transaction.get_connection().in_atomic_block
    # causes first, so a symptom of the same settle finds its cause's incident; information joins what they opened
    alerts = sorted(Alert.objects.filter(id__in=set(alert_ids)), key=precedence)
    if not alerts:
        return []
    open_ones = list(Incident.objects.select_for_update().filter(run=run, state=Incident.State.FIRING).order_by("id"))
    members = _members(open_ones)
    grew: set[int] = set()
    touched: dict[int, Incident] = {}
    for alert in alerts:
        incident = _home(alert, open_ones, members, run.world_size)
        if incident is None:
            continue
        if alert.incident_id != incident.id:
            alert.incident = incident
            alert.save(update_fields=["incident"])
            members.setdefault(incident.id, []).append(alert)
            grew.add(incident.id)
        touched[incident.id] = incident
    return [i.id for i in touched.values() if refresh(i, grew=i.id in grew)]


def _home(alert: Alert, open_ones: list[Incident], members: dict[int, list[Alert]], world: int) -> Incident | None:
    """The incident an alert belongs to: its own while that fires, else a matching open one, else a
    new one (only for a firing alert: a resolved one that never paged opens nothing)."""
    own = next((i for i in open_ones if i.id == alert.incident_id), None)
    if own is not None:
        return own
    firing = alert.state == Alert.State.FIRING
    if alert.incident_id is not None:  # its incident had resolved: reopen it for a new episode
        if not firing or alert.severity == INFO:
            return None
        reopened = Incident.objects.select_for_update().get(id=alert.incident_id)
        open_ones.append(reopened)
        members[reopened.id] = list(reopened.alerts.all())
        return reopened
    if not firing:
        return None
    match = _match(alert, open_ones, members, world)
    if match is None and alert.severity == INFO:
        return None
    if match is None:
        match = Incident.objects.create(run_id=alert.run_id, cause=cause_of(alert), severity=alert.severity, root=alert)
        open_ones.append(match)
        members[match.id] = []
    return match


def _match(alert: Alert, open_ones: list[Incident], members: dict[int, list[Alert]], world: int) -> Incident | None:
    ranks = set(cause_ranks(alert))
    if alert.frame and alert.kind in FRAME_FOLLOWERS and consequence_of(alert) is None:
        for incident in open_ones:
            if any(
                m.frame == alert.frame and (not ranks or ranks <= set(m.ranks) or set(m.ranks) <= ranks)
                for m in members.get(incident.id, [])
            ):
                return incident
    if consequence_of(alert) is None:
        for incident in open_ones:
            if any(explains(alert, m) or explains(m, alert) for m in members.get(incident.id, [])):
                return incident
    key = cause_of(alert)
    exact = next((i for i in open_ones if i.cause == key), None)
    if exact is not None or not ranks:
        return exact
    # a subset of a minority's ranks: the same dissenters, fewer of them (never every rank: a run-wide
    # finding such as ineffective_compile must not swallow a rank that dies later)
    return next((i for i in open_ones if ranks <= _ranks_of(i.cause) and len(_ranks_of(i.cause)) < world), None)


def explains(cause: Alert, symptom: Alert) -> bool:
    """`cause` at the same or an earlier step accounts for `symptom`. A recompile or another graph
    explains a symptom of no ranks (the run against its baseline) or of the cause's ranks, or one
    that could not say which of its ranks is off (no majority: `details["tie"]`) and holds the
    cause's ranks. NaN gradients on some ranks explain NaN gradients on every rank later (their NaN
    weights went into the all-reduce), and those ranks' gradients or weights differing from the others'.
    Ranks that all crash alike in a step account for their gradients or weights differing in the step
    before (DDP with an unused parameter: the reduction of step 0 never finished, then every rank
    raises "Expected to have finished reduction" in step 1)."""
    if cause.kind == "rank_crashed" and symptom.kind in NAN_SPREADS:
        return _crash_explains(cause, symptom)
    if cause.step is None or symptom.step is None or cause.step > symptom.step:
        return False
    if cause.kind == "nonfinite_grad" and not _everywhere(cause):
        if symptom.kind == "nonfinite_grad":
            return _everywhere(symptom)
        return symptom.kind in NAN_SPREADS and bool(symptom.ranks) and set(symptom.ranks) <= set(cause.ranks)
    if cause.kind not in CAUSES or symptom.kind not in SYMPTOMS:
        return False
    mine, theirs = set(cause.ranks), set(symptom.ranks)
    return not theirs or theirs <= mine or (bool((symptom.details or {}).get("tie")) and mine <= theirs)


def _crash_explains(crash: Alert, divergence: Alert) -> bool:
    """The divergence is of step S - 1 or S of a crash in step S, and either it names only ranks that
    crashed alike (`details["alike"]`) or it found no majority (every rank differs: `details["tie"]`)
    and names the crashed rank: the first of the ranks to crash alike is seen alone."""
    if crash.step is None or divergence.step is None or not crash.step - 1 <= divergence.step <= crash.step:
        return False
    crashed = set((crash.details or {}).get("alike") or crash.ranks)
    ranks = set(divergence.ranks)
    tie = bool((divergence.details or {}).get("tie"))
    return bool(ranks) and (ranks <= crashed if len(crashed) > 1 else tie and crashed <= ranks)


def _everywhere(alert: Alert) -> bool:
    return bool((alert.details or {}).get("everywhere"))


def _ranks_of(cause: str) -> set[int]:
    """The ranks a cause names; none for a cause cut to its column (`text.fit_key`)."""
    if not cause.startswith("ranks:") or text.ELLIPSIS in cause:
        return set()
    return text.parse_ranges(cause.removeprefix("ranks:"))


def _members(incidents: list[Incident]) -> dict[int, list[Alert]]:
    out: dict[int, list[Alert]] = {i.id: [] for i in incidents}
    for alert in Alert.objects.filter(incident__in=incidents):
        assert alert.incident_id is not None  # filtered on its incident
        out[alert.incident_id].append(alert)
    return out


def refresh(incident: Incident, grew: bool = False) -> bool:
    """Recompute root, severity and state from the incident's alerts; True (and a new revision) when
    the page changes."""
    alerts = list(incident.alerts.all())
    if not alerts:
        return False
    root = min(alerts, key=precedence)
    severity = max((a.severity for a in alerts), key=lambda s: _SEVERITY.get(s, 0))  # never de-escalates
    state = state_of(alerts)
    changed = grew or root.id != incident.root_id or severity != incident.severity or state != incident.state
    if not changed:
        return False
    if state != incident.state:
        incident.resolved_at = timezone.now() if state != Incident.State.FIRING else None
        if state == Incident.State.RESOLVED:
            incident.acked_by, incident.acked_at = None, None  # an ack lasts until the trouble is over
    if root.id != incident.root_id:  # re-rooted: later alerts of the new root's ranks find it
        incident.cause = cause_of(root)
    incident.root, incident.severity, incident.state = root, severity, state
    incident.revision += 1
    incident.save()
    return True


def state_of(alerts: list[Alert]) -> str:
    """Firing while any alert fires; else ended_unresolved while the run's end closed any of them
    before it got better (the cause is not fixed); else resolved."""
    states = {a.state for a in alerts if a.severity != INFO}
    for state in (Alert.State.FIRING, Alert.State.ENDED_UNRESOLVED):
        if state in states:
            return Incident.State(state.value)
    return Incident.State.RESOLVED


def refresh_of(alerts: Iterable[Alert]) -> list[int]:
    """Refresh the incidents of alerts that changed outside `place` (resolved by hand, at run end)."""
    ids = {a.incident_id for a in alerts if a.incident_id}
    incidents = Incident.objects.select_for_update().filter(id__in=ids).order_by("id")
    return [i.id for i in incidents if refresh(i)]


def recount(alerts: Iterable[Alert]) -> None:
    """Alerts that fired again without news (their counts grew): their incidents' pages carry counts,
    so a new revision, at most every `RECOUNT_S` per incident (delivery rate-limits such updates too)."""
    ids = {a.incident_id for a in alerts if a.incident_id}
    stale = timezone.now() - timedelta(seconds=RECOUNT_S)
    Incident.objects.filter(id__in=ids, state=Incident.State.FIRING, last_change__lt=stale).update(
        revision=F("revision") + 1, last_change=timezone.now()
    )


def acknowledge(incident: Incident, user: User | None) -> Incident:
    """Someone is on it: a new revision, so PagerDuty and Alertmanager hear of it too."""
    incident.acked_by, incident.acked_at = user, timezone.now()
    incident.revision += 1
    incident.save(update_fields=["acked_by", "acked_at", "revision", "last_change"])
    return incident


def unacknowledge(incident: Incident) -> Incident:
    incident.acked_by, incident.acked_at = None, None
    incident.revision += 1
    incident.save(update_fields=["acked_by", "acked_at", "revision", "last_change"])
    return incident


def mark_notified(incident: Incident) -> None:
    """Delivery paged this revision (`revision` ahead of `notified_revision` is pending)."""
    incident.notified_revision = incident.revision
    incident.save(update_fields=["notified_revision"])


RUN_ENDED = "run ended"  # lifecycle's resolve reason for alerts the end of their run closed
UNRESOLVED = (Incident.State.FIRING, Incident.State.ENDED_UNRESOLVED)  # states that still count


def unresolved(incident: Incident) -> bool:
    """Open, or closed only because the run ended: a diverged rank must not clear itself when the job
    stops (the incidents API says it as `unresolved`)."""
    return incident.state in UNRESOLVED


def unhandled(incident: Incident) -> bool:
    """What `lockstep check` fails on: unresolved, and nobody acknowledged it."""
    return incident.acked_by_id is None and unresolved(incident)


def open_roots(run: Run) -> list[Incident]:
    """The run's unhandled incidents (`unhandled`)."""
    return [i for i in Incident.objects.filter(run=run).select_related("root") if unhandled(i)]
