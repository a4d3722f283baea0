"""Bulk version 2 (`protocol.Packed`): a relay's batches with their agreement sent once.

Each batch keeps its identity: a packed batch sent again alone, uncompressed, is a duplicate, and
other content under its (session, seq) a 409. The real recordings give the same evidence and the
same alerts and incidents packed as sent batch by batch.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tarfile
from collections import defaultdict

import msgspec
import pytest

from agents import agreement, protocol
from agents.spool import list_batches
from dashboard.detection.models import Alert, Incident
from dashboard.evidence import reads, writes
from dashboard.evidence.models import CompileEvent, GradReport, IngestSession
from dashboard.tenancy.models import Project, ProjectToken, Run
from tests import claims
from tests.agents.test_fixtures_ingest import FIXTURES, _settle_everything
from tests.conftest import post_bulk

pytestmark = pytest.mark.django_db


def batch(rank: int, seq: int = 0, fps: int = 7, key: str = "packed", ts: float = 100.0) -> protocol.Batch:
    return protocol.Batch(
        v=1,
        run=protocol.RunInfo(key=key, world_size=8),
        rank=rank,
        session=f"packed-session-{rank}",
        seq=seq,
        events=[protocol.Grads.pack(0, [[fps, 2]] * 2, ts=ts + rank / 1000)],
    )


def packed(batches: list[protocol.Batch | bytes]) -> bytes:
    return agreement.pack(batches)


def test_agreeing_ranks_travel_once_and_are_stored_as_one_row_per_step(client, token):
    batches = [batch(r) for r in range(8)]
    batches[5] = batch(5, fps=9)  # one dissenting rank
    body = packed(batches)
    assert body.count(b'"grads"') == 2  # the agreement once, the dissent once
    reply = post_bulk(client, token, body)
    assert reply.status_code == 200, reply.content
    assert [r["accepted"] for r in reply.json()["results"]] == [1] * 8
    rows = sorted((g.step, sorted(g.ranks), g.fps[0]) for g in GradReport.objects.all())
    assert rows == [(0, [0, 1, 2, 3, 4, 6, 7], 7), (0, [5], 9), (1, [0, 1, 2, 3, 4, 6, 7], 7), (1, [5], 9)]
    assert claims.count() == 8
    reports = reads.grad_reports(reads.grad_rows(Run.objects.get(key="packed").id, 0, "ddp"))
    assert sorted(reports) == list(range(8)) and reports[5].fps[0] == 9
    assert len({id(r) for r in reports.values()}) == 2  # the checks read a row's ranks as one report, shared


def test_a_packed_batch_sent_again_alone_is_a_duplicate_and_other_content_a_conflict(client, token, post):
    assert post_bulk(client, token, packed([batch(r) for r in range(4)])).status_code == 200
    again = post(protocol.encode(batch(2)))
    assert again.status_code == 200 and again.json()["duplicate"], again.content
    changed = post(protocol.encode(batch(2, fps=8)))
    assert changed.status_code == 409, changed.content
    # and the other way: sent alone first, then packed with others
    assert post(protocol.encode(batch(6))).status_code == 200
    reply = post_bulk(client, token, packed([batch(5), batch(6), batch(7)])).json()
    assert [r["duplicate"] for r in reply["results"]] == [False, True, False]


def test_results_follow_the_packed_order_and_raw_batches_travel_as_sent(client, token):
    odd = b'{"v":1, "run":{"key":"packed","world_size":8},"rank":3,"session":"packed-session-3","seq":0,"events":[]}'
    assert agreement.packable(odd) is None  # not this encoder's bytes: it travels as sent
    entries: list[protocol.Batch | bytes] = [batch(2), odd, batch(1)]
    assert agreement.order(entries) == [2, 0, 1]
    reply = post_bulk(client, token, packed(entries))
    assert reply.status_code == 200, reply.content
    assert len(reply.json()["results"]) == 3
    run = Run.objects.get(key="packed")
    assert writes.claim_of(run, "packed-session-3", 0, hashlib.sha256(odd).hexdigest()) == "same"
    assert writes.claim_of(run, "packed-session-3", 0, "0" * 64) == "other"


@pytest.mark.parametrize(
    "change,path",
    [
        (lambda p: p["agreed"][0].update(of=[[0, 9]]), "agreed[0].of"),
        (lambda p: p["agreed"][0].update(ts=[1.0]), "agreed[0].ts"),
        (lambda p: p["batches"][1].update(run=4), "batches[1].run"),
        (lambda p: p["agreed"][0].update(at=3), "batches[0].events"),
        (lambda p: p["batches"][1].update(rank=9), "batches[1].rank"),
    ],
)
def test_parts_that_do_not_fit_are_a_400_naming_them(client, token, change, path):
    body = msgspec.json.decode(packed([batch(r) for r in range(3)]))
    change(body)
    reply = post_bulk(client, token, msgspec.json.encode(body))
    assert reply.status_code == 400 and reply.json()["path"] == path, reply.content
    assert not IngestSession.objects.exists()


def _spool(name: str, into) -> list[bytes]:
    with tarfile.open(os.path.join(FIXTURES, name)) as tar:
        tar.extractall(into, filter="data")
    bodies = []
    for path in list_batches(str(into)):
        with open(path, "rb") as f:
            raw = f.read()
        bodies.append((gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).strip())
    return bodies


def _outcome(project: Project) -> tuple[list, list, list, int]:
    run = Run.objects.get(project=project)
    _settle_everything(run)
    alerts = sorted(
        (a.kind, a.subject, a.severity, a.state, a.ranks, a.step, a.frame, a.message, msgspec.json.encode(a.details))
        for a in Alert.objects.filter(run=run)
    )
    incidents = sorted(
        (i.cause, i.severity, i.state, i.root.kind if i.root else None, sorted(a.kind for a in i.alerts.all()))
        for i in Incident.objects.filter(run=run)
    )
    # per rank: packed ranks share rows where ranks sent one by one do not
    grads = sorted((g.group, g.step, r, tuple(g.fps)) for g in GradReport.objects.filter(run=run) for r in g.ranks)
    return alerts, incidents, grads, CompileEvent.objects.filter(run=run).count()


@pytest.mark.parametrize("fixture", ["ddp_h200_spool.tgz", "ddp_cpu213_spool.tgz"])
def test_real_recordings_raise_the_same_alerts_packed_or_not(client, post, token, project, tmp_path, fixture):
    """The recorded 2-rank jobs, sent batch by batch by one project and packed by another: in windows of
    the ranks' batches of the same seq, as a node relay forwards them when the ranks flush together
    (the H200 job), or the whole recording in one request (the CPU job, whose ranks' batches of a seq
    hold different steps)."""
    bodies = _spool(fixture, tmp_path)
    for body in bodies:
        assert post(body).status_code == 200
    other = Project.objects.create(name="packed-replay")
    other_token = ProjectToken.issue(other)
    windows: dict[int, list[protocol.Batch | bytes]] = defaultdict(list)
    for body in bodies:
        decoded = agreement.packable(body)
        assert decoded is not None  # what agents send is packable
        windows[decoded.seq if "h200" in fixture else 0].append(decoded)
    shared = 0
    for seq in sorted(windows):
        body = packed(windows[seq])
        shared += len(msgspec.json.decode(body, type=protocol.Packed).agreed)
        reply = post_bulk(client, other_token, body)
        assert reply.status_code == 200, reply.content
    assert shared > 0  # the replicas' agreement travelled once
    alone, together = _outcome(project), _outcome(other)
    assert together == alone
    assert alone[0] and alone[1]  # the recordings do raise alerts and an incident
    assert (
        GradReport.objects.filter(run__project=other).count() < GradReport.objects.filter(run__project=project).count()
    )
