"""Raw tables are partitioned by day; retention drops whole partitions and idle agent sessions' claims."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from dashboard.evidence import partitions, retention
from dashboard.evidence.models import CollectiveWait, GradReport, IngestSession
from dashboard.tenancy.models import Run
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


def test_raw_tables_are_partitioned_by_day():
    with connection.cursor() as cur:
        cur.execute("SELECT relname FROM pg_class WHERE relkind = 'p' AND relname LIKE 'evidence_%%'")
        assert {row[0] for row in cur.fetchall()} == set(partitions.RAW_TABLES)
    today = timezone.now().date()
    assert today in {day for _, day in partitions.existing("evidence_gradreport")}


def test_prune_drops_old_partitions_and_keeps_recent_rows(post):
    assert post(make_batch()).status_code == 200
    old_day = timezone.now().date() - timedelta(days=30)
    partitions.ensure([old_day])
    run = Run.objects.get()
    GradReport.objects.create(
        run=run,
        ranks=[1],
        step=0,
        group="ddp",
        fps=[1],
        ts=timezone.now(),
        received=timezone.now() - timedelta(days=30),
    )
    IngestSession.objects.update(last_at=timezone.now() - timedelta(days=30))
    for step, age in ((250, 30), (750, 0)):
        CollectiveWait.objects.create(
            run=run, rank=1, step=step, seconds=6.0, received=timezone.now() - timedelta(days=age)
        )
    assert GradReport.objects.count() == 2

    pruned = retention.prune(days=14)

    assert f"evidence_gradreport_p{old_day:%Y%m%d}" in pruned.partitions
    assert len(pruned.partitions) == len(partitions.RAW_TABLES)  # one old day per raw table
    assert list(GradReport.objects.values_list("ranks", flat=True)) == [[0]]
    assert pruned.sessions == 1 and not IngestSession.objects.exists()
    assert pruned.waits == 1 and list(CollectiveWait.objects.values_list("step", flat=True)) == [750]
    ahead = {day for _, day in partitions.existing("evidence_gradreport")}
    assert timezone.now().date() + timedelta(days=retention.PREPARE_DAYS) in ahead


def test_command_and_setting(settings, capsys):
    settings.LOCKSTEP_RAW_RETENTION_DAYS = 3
    old_day = timezone.now().date() - timedelta(days=5)
    partitions.ensure([old_day])
    call_command("prune_raw")
    out = capsys.readouterr().out
    assert f"dropped evidence_stepreport_p{old_day:%Y%m%d}" in out
    assert old_day not in {day for _, day in partitions.existing("evidence_stepreport")}


def test_workers_know_the_ingest_tasks(settings):
    from dashboard.celery import app

    schedule = settings.CELERY_BEAT_SCHEDULE["prune-raw-partitions"]
    app.loader.import_default_modules()
    assert schedule["task"] in app.tasks
    assert "dashboard.detection.tasks.settle_slots" in app.tasks
