"""Graph texts are kept per project: what one project stored changes nothing another is asked, told
or shown, so no token can probe whether another project holds a text. Through the real door."""

from __future__ import annotations

import json

import pytest

from agents import protocol
from dashboard.evidence import reads
from dashboard.evidence.models import Blob
from dashboard.tenancy.models import Project, ProjectToken, Run
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db
TEXT = "def forward(self, x):\n    return x.cos() * self.scale  # a text both projects compile\n"
HASH = protocol.blob_hash(TEXT)


COMPILE = {
    "t": "compile",
    "frame": "m.py:1:forward",
    "index": 0,
    "hashes": {"dynamo": {"raw": "ab" * 16, "norm": HASH}},
}
UPLOAD = {"v": 1, "blobs": [{"hash": HASH, "text": TEXT}]}


def _send(client, token: str, path: str, body: dict) -> dict:
    answer = client.post(path, json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert answer.status_code == 200, answer.content
    return answer.json()


def _asked(client, token: str, seq: int = 0) -> list[str]:
    return _send(client, token, "/api/v1/ingest", make_batch(run="job", seq=seq, events=[COMPILE]))["want_blobs"]


def test_a_text_another_project_stored_is_still_asked_stored_and_shown_per_project(client):
    a, b = (ProjectToken.issue(Project.objects.create(name=name)) for name in ("team-a", "team-b"))
    assert _asked(client, a) == [HASH]
    assert _send(client, a, "/api/v1/blobs", UPLOAD)["stored"] == [HASH]

    assert _asked(client, b) == [HASH]  # as if nobody held it: B learns nothing of A's texts
    run_b = Run.objects.get(project__name="team-b")
    assert reads.graph_texts(run_b.id, [HASH]) == {}  # A's copy is not B's to read
    assert _send(client, b, "/api/v1/blobs", UPLOAD) == {"stored": [HASH], "known": []}
    assert reads.graph_texts(run_b.id, [HASH]) == {HASH: TEXT}
    size = len(TEXT.encode())
    assert sorted(Blob.objects.values_list("project__name", "size")) == [("team-a", size), ("team-b", size)]
    assert _asked(client, b, seq=1) == []  # each counted against its own project's quota, asked once
