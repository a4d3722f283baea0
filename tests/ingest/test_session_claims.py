"""Batch claims kept per agent session (`IngestSession`): one row per (run, session) holding the
accepted seqs and the digests of the latest RECENT_SEQS, and what a resend or a conflict is told."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from agents import protocol
from dashboard.evidence import writes
from dashboard.evidence.models import RECENT_SEQS, IngestSession
from dashboard.tenancy.models import Run
from tests import claims
from tests.conftest import make_batch, post_bulk

pytestmark = pytest.mark.django_db


def grads(step: int, fp: int = 1) -> list[dict]:
    return [{"t": "grad", "step": step, "fps": [fp, 2, 3]}]


def test_a_session_is_one_row_whatever_the_order_of_its_seqs(post):
    for seq in [0, 1, 3, 2, *range(4, 40)]:
        assert post(make_batch(seq=seq, events=grads(seq))).status_code == 200
    [row] = IngestSession.objects.all()
    assert (row.batches, row.events, row.high, str(row.seqs)) == (40, 40, 39, "{[0, 40)}")
    assert claims.pairs() == [("sess-run-a-0", seq) for seq in range(40)]


def test_a_resend_is_a_duplicate_and_other_content_under_a_latest_seq_is_a_409(post):
    for seq in range(40):
        post(make_batch(seq=seq, events=grads(seq)))
    for seq in (39, 39 - RECENT_SEQS + 1):  # the newest and the oldest seq whose digest is kept
        again = post(make_batch(seq=seq, events=grads(seq)))
        assert again.status_code == 200 and again.json()["duplicate"] is True
        other = post(make_batch(seq=seq, events=grads(seq, fp=9)))
        assert other.status_code == 409 and other.json()["path"] == "seq"
    assert IngestSession.objects.get().batches == 40


def test_other_content_under_a_seq_older_than_the_kept_digests_is_taken_for_a_resend(post):
    for seq in range(40):
        post(make_batch(seq=seq, events=grads(seq)))
    older = post(make_batch(seq=39 - RECENT_SEQS, events=grads(0, fp=9)))
    assert older.status_code == 200 and older.json() == {**older.json(), "accepted": 0, "duplicate": True}
    assert IngestSession.objects.get().batches == 40


def test_the_same_session_id_in_two_runs_or_two_ranks_claims_apart(post, client, token):
    assert post(make_batch(run="a", session="shared-session", seq=0)).status_code == 200
    assert post(make_batch(run="b", session="shared-session", seq=0)).json()["duplicate"] is False
    # two ranks under one session id in one request: a statement updates a session's row once
    body = protocol.bulk_body(
        [json.dumps(make_batch(run="c", rank=r, session="shared-session", seq=r)).encode() for r in range(2)]
    )
    reply = post_bulk(client, token, body)
    assert [r["duplicate"] for r in reply.json()["results"]] == [False, False]
    assert claims.pairs(run__key="c") == [("shared-session", 0), ("shared-session", 1)]
    assert IngestSession.objects.count() == 3


@pytest.mark.django_db(transaction=True)
def test_the_upgrade_carries_the_claims_of_one_row_per_batch_over(project):
    run = Run.reported(project, "r", "r", 2, {})
    executor = MigrationExecutor(connection)
    executor.migrate([("evidence", "0001_initial")])
    try:
        with connection.cursor() as cursor:
            for seq in (*range(20), 25):
                cursor.execute(
                    "INSERT INTO evidence_ingestbatch (session, seq, digest, run_id, rank, events, received_at)"
                    " VALUES ('s', %s, %s, %s, 1, 2, now())",
                    [seq, f"{seq:016x}" + "0" * 48, run.id],
                )
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    row = IngestSession.objects.get()
    assert (row.rank, row.batches, row.events, row.high, str(row.seqs)) == (1, 21, 42, 25, "{[0, 20), [25, 26)}")
    assert writes.claim_of(run, "s", 19, f"{19:016x}" + "f" * 48) == "same"  # the first 64 bits decide
    assert writes.claim_of(run, "s", 19, f"{18:016x}" + "0" * 48) == "other"
    assert writes.claim_of(run, "s", 22, f"{22:016x}" + "0" * 48) == "none"
    assert writes.claim_of(run, "s", 3, "f" * 64) == "same"  # older than the digests kept
