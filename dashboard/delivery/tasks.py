"""Celery tasks of delivery: push alert and incident revisions (websockets, then destinations), retry
notifications, keep Alertmanager's copies fresh and its silences in step, and a periodic sweep for
revisions nobody delivered (a worker killed between commit and push) and for the live progress of
active runs.

Delivery subscribes to `detection.signals.alerts_changed` (an alert's change carries its incident's
along) and to saved silences; the outbox state (`revision` against `notified_revision`, pending
rows) is in PostgreSQL, so whatever a lost message misses, the sweep delivers.

An alert's way to its destinations goes at the broker's top priority (`fairness.PAGES`), above
every settle: on a busy worker the page had waited 2-3 s behind the settles queued before it.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import transaction

from dashboard.delivery import mirror, notifications, notify
from dashboard.detection import runs
from dashboard.detection.fairness import PAGES
from dashboard.detection.models import Silence

log = logging.getLogger(__name__)


@shared_task(acks_late=True, ignore_result=True, priority=PAGES)
def deliver(alert_id: int) -> int:
    """The alert's revision to websockets, then its incident's revision everywhere."""
    incident_id = notify.deliver(alert_id)
    return deliver_incident(incident_id) if incident_id is not None else 0


@shared_task(acks_late=True, ignore_result=True, priority=PAGES)
def deliver_incident(incident_id: int) -> int:
    """The incident's revision to its destinations: the first notification's first attempt here (a
    page waits for no second task: under load a queued hop cost 1-1.7 s), the others as tasks of their
    own, so one slow destination never holds up another."""
    notes, rows = notify.deliver_incident(incident_id)
    for note_id in notes[1:]:
        send_webhook.delay(note_id)
    for row_id in rows:
        sync_silence.delay(row_id)
    if notes:
        notifications.send(notes[0])
    return len(notes)


@shared_task(acks_late=True, ignore_result=True, priority=PAGES)
def send_webhook(notification_id: int) -> None:
    """One attempt; a failed one is rescheduled in its row and re-queued by the sweep (`notifications.due`)."""
    notifications.send(notification_id)


@shared_task(acks_late=True, ignore_result=True, priority=PAGES)
def refresh_webhook(notification_id: int) -> None:
    notifications.refresh(notification_id)


@shared_task(acks_late=True, ignore_result=True)
def sync_silence(row_id: int) -> None:
    mirror.sync(row_id)


@shared_task(acks_late=True, ignore_result=True)
def mirror_silences(project_id: int) -> int:
    rows = mirror.plan_project(project_id)
    for row_id in rows:
        sync_silence.delay(row_id)
    return len(rows)


@shared_task(ignore_result=True)
def sweep() -> int:
    """Every 2 s (beat): progress of active runs to their pages (and of runs that ended a moment ago, so
    that a page left open says so), pending alert and incident revisions
    delivered, due notifications sent (first attempts lost on the way, retries, rate-limited updates),
    Alertmanager's firing incidents refreshed, pending silences synced."""
    active = runs.active_runs()
    for run in active:
        notify.push_progress(run, runs.rank_rows(run), runs.strip(run))
    for run in runs.just_ended():  # its last rank ended: the pages left open learn it (no strip)
        if run not in active:
            notify.push_progress(run, runs.rank_rows(run))
    pending = notify.pending()
    for alert_id in pending:
        deliver.delay(alert_id)
    for incident_id in notify.pending_incidents():
        deliver_incident.delay(incident_id)
    for note_id in notifications.due():
        send_webhook.delay(note_id)
    for note_id in notifications.refresh_due():
        refresh_webhook.delay(note_id)
    for row_id in mirror.due():
        sync_silence.delay(row_id)
    return len(pending)


def on_alerts_changed(sender: object, alert_ids: list[int], **kwargs: object) -> None:
    """detection.signals.alerts_changed."""
    for alert_id in alert_ids:
        deliver.delay(alert_id)


def on_silence_saved(sender: object, instance: Silence, **kwargs: object) -> None:
    """A Lockstep silence made or expired: Alertmanager destinations of its project follow (after
    commit; with the broker down the silence is still stored, and the next incident revision plans it)."""
    project_id = instance.project_id

    def queue() -> None:
        try:
            mirror_silences.delay(project_id)
        except Exception:
            log.warning(
                "broker unavailable; Alertmanager silences of project %s follow later", project_id, exc_info=True
            )

    transaction.on_commit(queue)
