"""A stopped sweep shows (issue 51, item 6): `/metrics` has the age of the last completed sweep, and a
live run's page warns once it is a few periods old; the beats of several workers send each sweep once
a period. The Redis is the suite's own."""

from __future__ import annotations

import math
import time
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from prometheus_client.parser import text_string_to_metric_families

from dashboard.beat_schedule import Scheduler
from dashboard.celery import app
from dashboard.detection import sweep_clock, tasks
from dashboard.tenancy.models import Run
from ingest import ratelimit
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_sweep_yet(settings):
    """No sweep completed before the test; /metrics readable without a token."""
    settings.LOCKSTEP_METRICS_PUBLIC = True
    ratelimit.client().delete(sweep_clock.KEY)
    yield
    ratelimit.client().delete(sweep_clock.KEY)


def sweep_age(client) -> float:
    response = client.get("/metrics")
    assert response.status_code == 200
    families = text_string_to_metric_families(response.content.decode())
    [age] = [s.value for f in families for s in f.samples if s.name == "lockstep_sweep_age_seconds"]
    return age


def completed_ago(seconds: float) -> None:
    ratelimit.client().set(sweep_clock.KEY, repr(time.time() - seconds))


def test_metrics_show_the_age_of_the_last_completed_sweep(client):
    assert math.isinf(sweep_age(client))  # none ever completed
    tasks.sweep()
    assert 0 <= sweep_age(client) < 2
    completed_ago(60)
    assert 59 < sweep_age(client) < 70


def run_page(client, post, project, run: str) -> str:
    user = User.objects.create_user(f"reader-{uuid.uuid4().hex[:6]}")
    project.members.add(user)
    client.force_login(user)
    response = client.get(f"/runs/{run}/")
    assert response.status_code == 200
    return response.content.decode()


def test_a_live_runs_page_warns_when_the_sweep_stopped(client, post, project):
    assert post(make_batch(run="swept", world_size=2)).status_code == 200
    completed_ago(60)
    page = run_page(client, post, project, "swept")
    assert 'data-notice="sweep-stopped"' in page
    assert "No sweep completed in the last 60 s" in page and "silent ranks not alerted" in page
    completed_ago(1)
    assert 'data-notice="sweep-stopped"' not in run_page(client, post, project, "swept")
    ratelimit.client().delete(sweep_clock.KEY)
    assert "No sweep completed ever" in run_page(client, post, project, "swept")


def test_an_ended_runs_page_does_not_warn(client, post, project):
    assert post(make_batch(run="over", world_size=2)).status_code == 200
    Run.objects.filter(key="over").update(last_seen=Run.objects.get(key="over").last_seen - timedelta(hours=1))
    completed_ago(60)
    assert 'data-notice="sweep-stopped"' not in run_page(client, post, project, "over")


def test_the_beats_of_several_workers_send_each_sweep_once_a_period(tmp_path, monkeypatch):
    sent: list[str] = []
    beats = [Scheduler(app, schedule_filename=str(tmp_path / f"beat-{i}"), lazy=True) for i in range(3)]
    for beat in beats:
        monkeypatch.setattr(beat, "apply_async", lambda entry, **kwargs: sent.append(entry.name))
    name = f"sweep-{uuid.uuid4().hex[:6]}"
    entry = beats[0].Entry(name=name, task=tasks.sweep.name, schedule=timedelta(seconds=1), app=app)
    period = int(time.time()) + 1
    time.sleep(period - time.time() + 0.05)  # well inside one period of Redis's clock (the same host's)
    for beat in beats:
        beat.apply_entry(entry)
    assert sent == [name]
    time.sleep(1)
    for beat in beats:
        beat.apply_entry(entry)
    assert sent == [name, name]
