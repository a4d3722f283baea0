"""The alert lifecycle, and the only code that writes alerts.

Findings become alerts (Alertmanager's model): identity (run, kind, subject), firing -> resolved,
counts and first/last seen, or ended_unresolved when the run ended first (it
still counts: resolved means fixed); people acknowledge and unacknowledge them; detection enriches them
(the parameters behind a divergence). Every change worth telling bumps `revision`, and only this
module does; delivery reports back which revision it pushed (`mark_notified`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from dashboard.detection import incidents, locks, text
from dashboard.detection.models import Alert
from dashboard.detection.rules import Finding
from dashboard.tenancy.models import Run

if TYPE_CHECKING:
    from django.contrib.auth.models import User

KEPT_ON_UPDATE = ("flight_recorder",)  # enrichments a finding's fresher details keep (until a new episode)


def apply(run: Run, findings: list[Finding], clean: Collection[tuple[str, str]], at: int | None) -> list[int]:
    """Record findings and resolve clean subjects in the caller's transaction; ids to deliver. One
    writer of a run's alerts at a time (`locks.RUN_ALERTS`): two settles of the run at once would
    each open an incident for what is one."""
    assert transaction.get_connection().in_atomic_block
    locks.hold(locks.RUN_ALERTS, run.id)
    recorded = [record(run, f, at) for f in findings]
    changed = [alert.id for alert, news in recorded if news]
    changed += [alert.id for alert in resolve(run, clean, at)]
    incidents.place(run, changed)
    incidents.recount([alert for alert, news in recorded if not news])
    return changed


OVERFLOW = "more:"  # subject prefix of the one alert per kind that counts a run's findings past its cap


def record(run: Run, finding: Finding, at: int | None = None) -> tuple[Alert, bool]:
    """Create or update the alert for this finding; True when it is news (new, new ranks, re-fired).
    Past the run's LOCKSTEP_ALERTS_PER_RUN alerts a new subject is counted in its kind's overflow
    alert instead (`overflowed`)."""
    finding = bounded(finding)
    if not Alert.objects.filter(run=run, kind=finding.kind, subject=finding.subject).exists() and _full(run):
        return overflowed(run, finding)
    alert, created = Alert.objects.select_for_update().get_or_create(
        run=run,
        kind=finding.kind,
        subject=finding.subject,
        defaults={
            "severity": finding.severity,
            "ranks": list(finding.ranks),
            "step": finding.step,
            "frame": finding.frame,
            "message": finding.message,
            "details": finding.details,
            "last_position": at,
        },
    )
    if created:
        return alert, True
    new_ranks = set(finding.ranks) - set(alert.ranks)
    refired = alert.state != Alert.State.FIRING
    alert.count += 1
    alert.ranks = sorted(set(alert.ranks) | new_ranks)
    if at is not None:
        alert.last_position = max(at, alert.last_position if alert.last_position is not None else at)
    escalated = _more_severe(finding.severity, alert.severity)
    earlier = finding.step is not None and (alert.step is None or finding.step < alert.step)
    if earlier or escalated or refired:  # the finding tells the story better (or tells a new episode)
        kept = {k: alert.details[k] for k in KEPT_ON_UPDATE if k in (alert.details or {}) and not refired}
        alert.message, alert.details = finding.message, {**finding.details, **kept}
    elif new_ranks and finding.step == alert.step:  # the same moment, more ranks: the text names them all
        alert.message, alert.details = finding.message, {**alert.details, **finding.details}
    if earlier:
        alert.step = finding.step
    if escalated:
        alert.severity = finding.severity
    news = bool(new_ranks) or refired or escalated
    if news:
        alert.state, alert.resolved_at = Alert.State.FIRING, None
        alert.resolved_by, alert.resolve_reason = None, ""
        alert.revision += 1
    alert.save()
    return alert, news


def _full(run: Run) -> bool:
    """The run holds its cap of alerts: a flood of divergent slots (thousands of frames) stores a bounded
    number of alerts, so settling, incidents and pages stay as cheap as for a small run."""
    return (
        Alert.objects.filter(run=run).exclude(subject__startswith=OVERFLOW).count() >= settings.LOCKSTEP_ALERTS_PER_RUN
    )


def overflowed(run: Run, finding: Finding) -> tuple[Alert, bool]:
    """Count a finding past the run's cap in the one alert of its kind that summarises the rest: the
    first left-out finding's story and how many more there are. News only when it is made: the
    incident it belongs to was paged already for the alerts before the cap."""
    alert, created = Alert.objects.select_for_update().get_or_create(
        run=run,
        kind=finding.kind,
        subject=f"{OVERFLOW}{finding.kind}",
        defaults={
            "severity": finding.severity,
            "ranks": list(finding.ranks),
            "step": finding.step,
            "frame": finding.frame,
            "message": f"1 more {finding.kind} past this run's alerts: {finding.message}",
            "details": {"left_out": 1, "first": finding.details},
        },
    )
    if not created:
        left_out = int((alert.details or {}).get("left_out", 0)) + 1
        alert.count += 1
        alert.details = {**alert.details, "left_out": left_out}
        head = alert.message.split(": ", 1)[-1]
        alert.message = f"{left_out} more {finding.kind} past this run's alerts: {head}"
        alert.save(update_fields=["count", "details", "message", "last_seen"])
    return alert, created


def bounded(finding: Finding) -> Finding:
    """The finding's column values cut to their columns (`text`): a rule's text never fails a settle;
    its message printable, whatever a training process put in the text it quotes."""
    return replace(
        finding,
        kind=text.fit(Alert, "kind", finding.kind),
        subject=text.fit_key(Alert, "subject", finding.subject),
        severity=text.fit(Alert, "severity", finding.severity),
        frame=text.fit(Alert, "frame", text.printable(finding.frame)) if finding.frame is not None else None,
        message=text.printable(finding.message),
    )


def resolve(run: Run, clean: Collection[tuple[str, str]], at: int | None) -> list[Alert]:
    """Resolve the firing alerts whose (kind, subject) came out clean later than they last fired; acks
    expire. A sweep of a large job clears a subject per rank and rule (100,000 ranks: hundreds of
    thousands), while a run holds few firing alerts: those are read and matched here, and only the
    matches locked, instead of one SQL condition per clean subject."""
    wanted = clean if isinstance(clean, set) else set(clean)
    if not wanted:
        return []
    firing = Alert.objects.filter(run=run, state=Alert.State.FIRING, kind__in={kind for kind, _ in wanted})
    ids = [i for i, kind, subject in firing.values_list("id", "kind", "subject") if (kind, subject) in wanted]
    if not ids:
        return []
    resolved = []
    for alert in Alert.objects.select_for_update().filter(id__in=ids, state=Alert.State.FIRING).order_by("id"):
        if at is not None and alert.last_position is not None and at <= alert.last_position:
            continue
        alert.state, alert.resolved_at = Alert.State.RESOLVED, timezone.now()
        alert.acked_by, alert.acked_at = None, None
        alert.revision += 1
        alert.save()
        resolved.append(alert)
    return resolved


RUN_ENDED = incidents.RUN_ENDED  # the resolve_reason of alerts the end of their run closed


def end_of_run(run: Run, last_words: dict[tuple[str, str], str] | None = None) -> list[int]:
    """The run ended: its firing alerts stop firing as ended_unresolved ("run ended": nothing got
    better, so they still count), each a new revision so every sink hears the close. `last_words`:
    (kind, subject) -> the message as it stands at the run's end, for alerts whose message would
    otherwise go stale (a silent rank's "nothing for N s"). Only alerts whose firing revision was
    delivered: no sink sees a close before the page it closes (the others wait for the next sweep)."""
    assert transaction.get_connection().in_atomic_block
    alerts = list(
        Alert.objects.select_for_update()
        .filter(run=run, state=Alert.State.FIRING, notified_revision__gte=F("revision"))
        .order_by("id")
    )
    for alert in alerts:
        alert.state, alert.resolved_at, alert.resolve_reason = Alert.State.ENDED_UNRESOLVED, timezone.now(), RUN_ENDED
        alert.message = (last_words or {}).get((alert.kind, alert.subject), alert.message)
        alert.revision += 1
        alert.save()
    incidents.refresh_of(alerts)
    return [alert.id for alert in alerts]


def acknowledge(alert: Alert, user: User | None) -> Alert:
    """Someone is on it. Not a new revision: webhooks stay quiet; websockets get a push."""
    alert.acked_by, alert.acked_at = user, timezone.now()
    alert.save(update_fields=["acked_by", "acked_at", "last_seen"])
    if alert.incident is not None and alert.incident.root_id == alert.id and alert.incident.acked_by_id is None:
        incidents.acknowledge(alert.incident, user)  # acking the root is acking the incident
    return alert


def unacknowledge(alert: Alert) -> Alert:
    alert.acked_by, alert.acked_at = None, None
    alert.save(update_fields=["acked_by", "acked_at"])
    if alert.incident is not None and alert.incident.root_id == alert.id and alert.incident.acked_by_id is not None:
        incidents.unacknowledge(alert.incident)
    return alert


BY_HAND = "resolved by hand"  # the resolve_reason of an alert a person (or a project's automation) closed


def resolve_by_hand(alert: Alert, user: User | None, reason: str) -> Alert:
    """An operator closes a stale alert: resolved, who (`user`, None for a project token: the caller
    names it in `reason`) and why, the ack expired as on any resolve; a new revision, so every sink
    hears the resolve, and its incident follows. A resolved alert stays as it is; one the run's end
    left unresolved becomes resolved (a person closed it)."""
    assert transaction.get_connection().in_atomic_block
    alert = Alert.objects.select_for_update().get(id=alert.id)
    if alert.state == Alert.State.RESOLVED:
        return alert
    alert.state, alert.resolved_at = Alert.State.RESOLVED, timezone.now()
    alert.resolved_by, alert.resolve_reason = user, f"{BY_HAND}: {reason}"
    alert.acked_by, alert.acked_at = None, None
    alert.revision += 1
    alert.save()
    incidents.refresh_of([alert])
    return alert


def enrich(alert: Alert, details: dict[str, Any], message: str | None = None, news: bool = False) -> None:
    """Add to an alert's details (and message); `news`: a change worth a notification (a new revision)."""
    alert.details = {**alert.details, **details}
    fields = ["details"]
    if message is not None:
        alert.message = message
        fields.append("message")
    if news:
        alert.revision += 1
        fields += ["revision", "last_seen"]
    alert.save(update_fields=fields)


def lock(alert_ids: set[int] | list[int]) -> None:
    """Row-lock alerts (in id order, so two lockers cannot deadlock) for the caller's transaction."""
    list(Alert.objects.select_for_update().filter(id__in=alert_ids).order_by("id").values_list("id", flat=True))


def mark_notified(alert: Alert) -> None:
    """Delivery pushed this revision (the outbox: `revision` ahead of `notified_revision` is pending)."""
    alert.notified_revision = alert.revision
    alert.save(update_fields=["notified_revision"])


_SEVERITY = {"warning": 1, "critical": 2}


def _more_severe(a: str, b: str) -> bool:
    return _SEVERITY.get(a, 0) > _SEVERITY.get(b, 0)
