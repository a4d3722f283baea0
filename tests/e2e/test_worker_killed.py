"""A Celery worker process killed (SIGKILL, by pid) in the middle of settling a slot: the task is
redelivered (acks_late, reject on worker lost) and the alert still appears exactly once."""

from __future__ import annotations

import os
import signal
import time

import psycopg
import pytest
import requests
from django.db import connection

from dashboard.detection.lifecycle import RUN_ENDED
from dashboard.detection.models import Alert
from dashboard.devstack.processes import descendants
from dashboard.ledger.models import GradSlot
from tests.conftest import make_batch
from tests.e2e.jobs import alert_feed, member_session, project_with_token
from tests.stack import database_url, unique

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]


def blocked_worker_pid(conn: psycopg.Connection, worker: int, timeout: float = 30) -> int:
    """The pid of the Celery pool process (below `worker`) whose session of this test's database waits
    on our row lock. Only this database and only that worker's processes: other pytest workers run
    beside this one, and a session of theirs that waits on a lock of their own must never be the one
    killed (a pytest worker killed so hung the whole run once, in pytest-xdist's crash recovery)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = {
            int(label.rsplit(":", 1)[1])
            for (label,) in conn.execute(
                "SELECT application_name FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND application_name LIKE 'lockstep:%'"
            )
        }
        if found := pids & {worker, *descendants(worker)}:
            [pid] = found
            return pid
        time.sleep(0.1)
    raise AssertionError("no worker ever blocked on the slot")


def test_alert_exactly_once_when_the_worker_dies_mid_task(stack, client, record_property):
    project, token = project_with_token("killed-worker")
    feed = alert_feed(stack, member_session(project, "kw"))
    run_key = unique("kw-run")
    for rank in (0, 1):
        batch = make_batch(run=run_key, rank=rank, events=[{"t": "grad", "step": 0, "fps": [1, 2]}])
        assert (
            client.post(
                "/api/v1/ingest", batch, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
            ).status_code
            == 200
        )
    slot = GradSlot.objects.get(run__key=run_key)
    with psycopg.connect(database_url(connection.settings_dict), autocommit=False) as lock:
        # An uncommitted alert with the same identity: the settling task's INSERT waits on it.
        lock.execute(
            "INSERT INTO detection_alert (run_id, kind, subject, severity, state, ranks, message, details, "
            "count, first_seen, last_seen, revision, notified_revision, resolve_reason) VALUES (%s, "
            "'grad_divergence', 'group:ddp', 'critical', 'firing', '{}', '', '{}', 1, now(), now(), 1, 0, '')",
            [slot.run_id],
        )
        batch = make_batch(run=run_key, rank=2, events=[{"t": "grad", "step": 0, "fps": [1, 9]}])
        assert (
            requests.post(
                f"{stack.url}/api/v1/ingest", json=batch, timeout=10, headers={"Authorization": f"Bearer {token}"}
            ).status_code
            == 200
        )
        with psycopg.connect(database_url(connection.settings_dict), autocommit=True) as watch:
            victim = blocked_worker_pid(watch, stack.worker.popen.pid)
        os.kill(victim, signal.SIGKILL)
        time.sleep(1)
        lock.rollback()  # release the lock: the redelivered task (or the sweep) settles the slot now
    alerts = feed.wait_for({"grad_divergence"}, timeout=60, run=run_key)
    time.sleep(3)  # room for any duplicate to show up
    feed.ws.close()
    assert Alert.objects.filter(run__key=run_key).count() == 1
    alert = Alert.objects.get(run__key=run_key)
    # Recorded once (revision 1); under a slow machine the run may already have gone silent and its end
    # closed the alert as ended (one revision more, a close and not a second page).
    closes = int(alert.resolve_reason == RUN_ENDED)
    assert (alert.ranks, alert.count, alert.revision) == ([2], 1, 1 + closes)
    assert alerts["grad_divergence"]["ranks"] == [2]
    assert [a["id"] for a in feed.alerts if a["state"] == "firing"] == [alert.id]  # pushed firing once
    assert [a["id"] for a in feed.alerts] == [alert.id] * (1 + closes)  # and its close, if the run ended meanwhile
    assert stack.worker.popen.poll() is None  # the worker's main process replaced its dead child
    record_property("alerts", 1)
    record_property("websocket_pushes", len(feed.alerts))
