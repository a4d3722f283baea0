"""A job's start: every rank's first batch reports the same compile slots, so every group of the
start counts on the same few rows. A group counts on them after its COMMIT, in a statement of its
own: its transaction leaves them unlocked to the end, so the other ingest processes' groups queue
neither behind its work nor behind its commit."""

from __future__ import annotations

import json

import psycopg
import pytest
from django.db import connection

from agents import protocol
from dashboard.ledger.models import CompileSlot
from ingest import writers
from tests.conftest import make_batch
from tests.ingest.test_blobs import compile_event
from tests.stack import database_url

pytestmark = pytest.mark.django_db(transaction=True)

COMPILE = compile_event()  # every rank compiled the same frame at the start


def job(project, rank: int) -> writers.Job:
    """One rank's first batch, as the door hands it to the writer."""
    raw = json.dumps(make_batch(run="start", rank=rank, world_size=4, events=[COMPILE])).encode()
    return writers.Job(project, [(protocol.decode_batch(raw), writers.digest(raw))])


def test_a_group_leaves_the_start_s_compile_slots_free_through_its_transaction(project, monkeypatch):
    assert writers.store_group([job(project, 0)])[0][0].accepted == 1  # the slot exists, committed
    other = psycopg.connect(database_url(connection.settings_dict), autocommit=True)
    other.execute("SET lock_timeout = '500ms'")
    seen: list[str] = []
    open_slots = writers._open_compile_slots

    def at_the_transaction_s_end(written):
        open_slots(written)
        try:  # another process's group of the same start, counting on the slot meanwhile
            other.execute("UPDATE ledger_compileslot SET reported = reported WHERE frame = %s", [COMPILE["frame"]])
            seen.append("free")
        except psycopg.errors.LockNotAvailable:
            seen.append("locked")

    monkeypatch.setattr(writers, "_open_compile_slots", at_the_transaction_s_end)
    assert writers.store_group([job(project, 1)])[0][0].accepted == 1
    other.close()
    assert seen == ["free"]
    assert list(CompileSlot.objects.values_list("reported", flat=True)) == [2]
