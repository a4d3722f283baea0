"""What the read API and the pages both do, written once.

Every operation takes the caller (a `Principal`: a project token, or a user with their projects)
and resolves what it names through the same visibility rule (`tenancy.access`), so neither door
can show or change more than the other. Failures are raised as `Refusal`; the doors render them.
Alert writes go through `detection.lifecycle`, silence writes through `detection.silences`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import transaction
from django.db.models import Count, F, OuterRef, QuerySet, Subquery
from django.db.models.expressions import OrderBy
from django.db.models.functions import Coalesce
from django.utils import timezone

from dashboard.delivery import notifications, notify
from dashboard.detection import bills, cost, incidents, lifecycle, signals, silences, verdict
from dashboard.detection import tasks as detection_tasks
from dashboard.detection.models import Alert, Baseline, Incident, Silence
from dashboard.tenancy import access
from dashboard.tenancy.auth import Principal
from dashboard.tenancy.models import RUN_STATUSES, Project, Run, with_status
from dashboard.web.pages import compare as comparing
from dashboard.web.pages import drift, timeline
from ingest.refusals import Refusal

if TYPE_CHECKING:
    from typing import TypedDict

    from django_stubs_ext import WithAnnotations

    class ListedColumns(TypedDict):
        """What `runs_list` adds to each run (`tenancy.models.with_status`, `_with_alert_counts`)."""

        ended: int
        run_status: str
        critical: int
        warning: int

    ListedRun = WithAnnotations[Run, ListedColumns]

Row = TypeVar("Row", Alert, Incident)  # the rows an action names by id

log = logging.getLogger(__name__)
MAX_COMPARED = 8


# --- runs --------------------------------------------------------------------------------


def run_for(caller: Principal, key: str) -> Run:
    """The caller's run of that key; a missing run and another project's are the same 404, so
    no caller can tell which keys exist (docs/design.md, Read API)."""
    found = access.visible_run(caller, key)
    if found is None:
        raise Refusal(404, f"no run {key!r}")
    return found


def runs_for(caller: Principal, keys: Iterable[str]) -> list[Run]:
    """Each distinct key resolved with `run_for`, in the order given."""
    return [run_for(caller, key) for key in dict.fromkeys(keys)]


RUNS_WINDOW = 2000  # the newest runs a list (and its status or health filters) looks at


def runs_list(caller: Principal, status: str = "", verdict_kind: str = "") -> QuerySet[ListedRun]:
    """The caller's newest RUNS_WINDOW runs, newest first, annotated with unresolved alert counts
    (`critical`, `warning`), ranks that ended (`ended`) and their status (so `Run.status` needs no
    query per run); only those of `status`, or of `verdict_kind` (`detection.verdict`), when one is
    given (an unknown one is a 400, not an empty list). The window is taken before anything is
    counted: the counts cost per run, and a project with years of runs must not pay for all of them
    on every page."""
    newest = caller.runs().order_by("-started_at").values("id")[:RUNS_WINDOW]
    runs = _with_alert_counts(Run.objects.filter(id__in=newest).select_related("project")).order_by("-started_at")
    if status:
        if status not in RUN_STATUSES:
            raise Refusal(400, f"unknown status {status!r}: use one of {', '.join(RUN_STATUSES)}", path="status")
        runs = runs.filter(run_status=status)
    if verdict_kind:
        if verdict_kind not in verdict.VERDICTS:
            raise Refusal(
                400, f"unknown verdict {verdict_kind!r}: use one of {', '.join(verdict.VERDICTS)}", path="verdict"
            )
        judged = verdict.of_runs(runs)
        runs = runs.filter(id__in=[run_id for run_id, v in judged.items() if v.kind == verdict_kind])
    return runs


def verdicts(runs: Iterable[Run]) -> dict[int, verdict.Verdict]:
    """Each run's verdict (runs from `runs_list` or `run_with_alert_counts`), one query for all."""
    return verdict.of_runs(runs)


def run_with_alert_counts(caller: Principal, key: str) -> ListedRun:
    """One run annotated like `runs_list` rows."""
    found = run_for(caller, key)
    return _with_alert_counts(Run.objects.filter(id=found.id).select_related("project")).get()


def run_timeline(caller: Principal, key: str) -> dict[str, Any]:
    return timeline.timeline(run_for(caller, key))


def run_cost(caller: Principal, key: str) -> dict[str, Any]:
    """The run's compile bill: the kept one while current, else computed now, once for all readers of
    the moment, and kept by the worker: reading writes nothing (`bills.current_bill`). `device` says
    what its seconds are of: "GPU" where every rank said it computes on a CUDA device, else "device"."""
    run = run_for(caller, key)
    return {**bills.current_bill(run), "device": cost.devices(run)}


def project_for(caller: Principal, name: str) -> Project:
    """One of the caller's projects; another project and a missing one are the same 404."""
    found = Project.objects.filter(name=name, id__in=caller.project_ids).first()
    if found is None:
        raise Refusal(404, f"no project {name!r}")
    return found


def compare(caller: Principal, keys: Iterable[str], tolerance: str | None = None) -> dict[str, Any]:
    """The comparison of 2 to MAX_COMPARED distinct runs (blank keys ignored); the first is the
    reference; `tolerance` (`?tol=`) is the relative drift that counts, default 1e-3."""
    distinct = list(dict.fromkeys(k for k in keys if k))
    if not 2 <= len(distinct) <= MAX_COMPARED:
        raise Refusal(400, "pass 2 to 8 run keys: ?runs=<key>,<key>[,...]")
    return comparing.compare(runs_for(caller, distinct), compare_tolerance(tolerance))


def compare_tolerance(text: str | None) -> float:
    try:
        return drift.parse_tolerance(text)
    except ValueError:
        raise Refusal(
            400, f"tol must be a number >= 0 (a relative difference, e.g. 1e-3), got {text!r}", path="tol"
        ) from None


def _with_alert_counts(runs: QuerySet[Run]) -> QuerySet[ListedRun]:
    return with_status(runs).annotate(critical=_firing("critical"), warning=_firing("warning"))


def _firing(severity: str) -> Coalesce:
    """The outer run's unresolved alerts of `severity` (firing, or ended unresolved: a run's end
    fixes nothing), as a subquery: a join would multiply the rows `with_status` counts over and
    force a GROUP BY over every run."""
    unresolved = (Alert.State.FIRING, Alert.State.ENDED_UNRESOLVED)
    alerts = Alert.objects.filter(run=OuterRef("pk"), state__in=unresolved, severity=severity)
    return Coalesce(Subquery(alerts.order_by().values("run").annotate(n=Count("pk")).values("n")), 0)


# --- baselines ---------------------------------------------------------------------------


def baseline_candidates(caller: Principal, run: Run) -> QuerySet[Run]:
    """Runs `run` may be held against: the other runs of its project that the caller sees."""
    return caller.runs().filter(project_id=run.project_id).exclude(id=run.id)


def choose_baseline(caller: Principal, run: Run, base_key: object) -> Baseline:
    """Hold `run` against the run keyed `base_key`, which must be another run of the same project
    (fingerprints of different jobs are not comparable); the comparison is queued after commit."""
    if not isinstance(base_key, str) or not base_key:
        raise Refusal(400, "baseline must be a run key", path="baseline")
    base = access.visible_run(caller, base_key, project_id=run.project_id)
    if base is None:
        run_for(caller, base_key)  # a 404 unless the caller sees it in another project
        raise Refusal(400, f"baseline {base_key!r} is not a run of project {run.project.name!r}", path="baseline")
    try:
        return detection_tasks.choose_baseline(run, base, caller.user)
    except ValueError as exc:
        raise Refusal(400, str(exc), path="baseline") from None


# --- alerts ------------------------------------------------------------------------------


def run_alerts(caller: Principal, key: str) -> QuerySet[Alert]:
    return run_for(caller, key).alerts.select_related("acked_by", "run")


NEWEST_FIRST = (F("opened_at").desc(), F("id").desc())
IN_STEP_ORDER = (F("root__step").asc(nulls_last=True), F("opened_at").asc(), F("id").asc())


def run_incidents(caller: Principal, key: str) -> list[dict[str, Any]]:
    """The run's incidents in step order (root step, none last, then the earliest opened), each with
    its root and its alerts (one query for all alerts): read top down, the run page and the API tell
    the run's story as its verdict does, step 5 before step 12."""
    return _incidents_json(Incident.objects.filter(run=run_for(caller, key)), order=IN_STEP_ORDER)


def visible_incidents(
    caller: Principal, run_key: str = "", state: str = "unresolved", limit: int = 100
) -> list[dict[str, Any]]:
    """The caller's incidents across runs (or one run's), newest first: the alerts page's head.
    `unresolved` is firing or ended unresolved (what `lockstep check` counts); "all" or an unknown
    state, every one."""
    found = Incident.objects.filter(run__project_id__in=caller.project_ids)
    if run_key:
        found = found.filter(run__key=run_key)
    if state == "unresolved":
        found = found.filter(state__in=incidents.UNRESOLVED)
    elif state in Incident.State.values:
        found = found.filter(state=state)
    return _incidents_json(found, limit)


def _incidents_json(
    queryset: QuerySet[Incident], limit: int | None = None, order: tuple[OrderBy, ...] = NEWEST_FIRST
) -> list[dict[str, Any]]:
    """In `order` (newest first unless told), each with its root, its alerts (one query for all alerts)
    and whether it is `unresolved` (what `lockstep check` fails on until someone acknowledges it)."""
    found = list(queryset.select_related("root", "acked_by", "run").order_by(*order)[:limit])
    members: dict[int, list[Alert]] = {i.id: [] for i in found}
    for alert in Alert.objects.filter(incident__in=found).order_by("first_seen", "id"):
        assert alert.incident_id is not None  # filtered on its incident
        members[alert.incident_id].append(alert)
    return [{**i.as_json(members[i.id]), "unresolved": incidents.unresolved(i)} for i in found]


def _on_callers_run(caller: Principal, queryset: QuerySet[Row], row_id: int, name: str) -> Row:
    """The row if it is on one of the caller's runs; a 404 otherwise, missing or not (no one learns
    which ids exist in other projects)."""
    row = queryset.filter(id=row_id).first()
    if row is None or not caller.can_see(row.run):
        raise Refusal(404, f"no {name} {row_id}")
    return row


def incident_for(caller: Principal, incident_id: int) -> Incident:
    return _on_callers_run(caller, Incident.objects.select_related("run", "root"), incident_id, "incident")


def acknowledge_incident(caller: Principal, incident_id: int) -> Incident:
    """The caller is on it: the incident and its root alert, which sinks hear of (PagerDuty acknowledge)."""
    incident = incident_for(caller, incident_id)
    with transaction.atomic():
        if incident.root is not None:
            lifecycle.acknowledge(incident.root, caller.user)
        incidents.acknowledge(incident, caller.user)
    return incident


def webhook_deliveries(alerts: list[Alert]) -> dict[int, dict[str, int]]:
    """Per alert, its webhook notifications pending, sent and failed (a failed one gave up after
    hours of retries: the page and the API show it)."""
    return notifications.delivery_states([a.id for a in alerts])


def alert_for(caller: Principal, alert_id: int) -> Alert:
    return _on_callers_run(caller, Alert.objects.select_related("run", "acked_by"), alert_id, "alert")


def acknowledge(caller: Principal, alert_id: int) -> Alert:
    """The caller's user is on it; open pages see it live."""
    alert = alert_for(caller, alert_id)
    with transaction.atomic():
        lifecycle.acknowledge(alert, caller.user)
        transaction.on_commit(lambda: _push(alert))
    return alert


def resolve_by_hand(caller: Principal, alert_id: int, reason: object) -> Alert:
    """Close a stale alert with who and why: a user by name, a project token as its project; sinks
    hear the resolve (a new revision, announced after commit)."""
    if not isinstance(reason, str) or not reason.strip():
        raise Refusal(400, 'say why: {"reason": "..."} (shown with the alert and sent to its destinations)')
    alert = alert_for(caller, alert_id)
    why = reason.strip()[:2000]
    if caller.user is None:
        why += f" (project token of {alert.run.project.name})"
    with transaction.atomic():
        alert = lifecycle.resolve_by_hand(alert, caller.user, why)
        transaction.on_commit(lambda: _announce(alert))
    return alert


def _announce(alert: Alert) -> None:
    """Best effort: with the broker down the sweep delivers the new revision later."""
    try:
        signals.announce([alert.id])
    except Exception:
        log.warning("announcing alert %s failed; the sweep delivers it", alert.id, exc_info=True)


def unacknowledge(caller: Principal, alert_id: int) -> Alert:
    alert = alert_for(caller, alert_id)
    with transaction.atomic():
        lifecycle.unacknowledge(alert)
        transaction.on_commit(lambda: _push(alert))
    return alert


def _push(alert: Alert) -> None:
    """Best effort: open run pages show the new ack state live; the stored state is what counts."""
    try:
        notify.push([alert])
    except Exception:
        log.warning("websocket push of alert %s failed", alert.id, exc_info=True)


# --- silences ----------------------------------------------------------------------------


def create_silence(caller: Principal, data: Mapping[str, Any]) -> Silence:
    """A silence from a valid SilenceForm's cleaned data, by the caller's user, in one of their projects."""
    project_id, run = _silence_scope(caller, data)
    return silences.create(
        project_id,
        run,
        kind=data.get("kind") or "",
        rank=data.get("rank"),
        until=timezone.now() + timedelta(hours=data["hours"]),
        comment=data["comment"],
        author=caller.user,
    )


def _silence_scope(caller: Principal, data: Mapping[str, Any]) -> tuple[int, Run | None]:
    """The project (and run) a silence applies to: the named run's, else the named project, else the
    caller's only project."""
    if data.get("run"):
        run = access.visible_run(caller, data["run"])
        if run is None:
            raise Refusal(400, f"no run {data['run']!r} in your projects")
        return run.project_id, run
    project_id = None
    if data.get("project"):  # named: it is the caller's or a 404, never a fallback to another of theirs
        named = Project.objects.filter(name=data["project"], id__in=caller.project_ids)
        project_id = named.values_list("id", flat=True).first()
        if project_id is None:
            raise Refusal(404, f"no project {data['project']!r} in your projects")
    elif len(caller.project_ids) == 1:
        project_id = next(iter(caller.project_ids))
    if project_id is None:
        raise Refusal(400, "choose a run or a project of yours")
    return project_id, None


def expire_silence(caller: Principal, silence_id: int) -> Silence:
    silence = Silence.objects.filter(id=silence_id, project_id__in=caller.project_ids).first()
    if silence is None:
        raise Refusal(404, f"no silence {silence_id}")
    silences.expire(silence)
    return silence
