"""Content-addressed graph texts: asked once across ranks, hash-verified, size-limited."""

from __future__ import annotations

import gzip
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from agents import protocol
from dashboard.evidence.models import Blob
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db
TEXT = "def forward(self, x):\n    return torch.relu(x) @ self.w\n"
HASH = protocol.blob_hash(TEXT)


def compile_event(norm: str = HASH) -> dict:
    return {
        "t": "compile",
        "frame": "m.py:1:forward",
        "index": 0,
        "hashes": {"dynamo": {"raw": "ab" * 16, "norm": norm}},
    }


@pytest.fixture
def upload(client, token):
    def _upload(blobs, *, gzip_=False):
        raw = json.dumps({"v": 1, "blobs": blobs}, ensure_ascii=False).encode()
        extra = {"HTTP_CONTENT_ENCODING": "gzip"} if gzip_ else {}
        return client.generic(
            "POST",
            "/api/v1/blobs",
            gzip.compress(raw) if gzip_ else raw,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
            **extra,
        )

    return _upload


def test_only_the_first_rank_is_asked_and_the_text_is_stored_once(post, upload):
    asked = [post(make_batch(rank=r, events=[compile_event()])).json()["want_blobs"] for r in range(3)]
    assert asked == [[HASH], [], []]
    response = upload([{"hash": HASH, "text": TEXT}], gzip_=True)
    assert response.status_code == 200, response.content
    assert response.json() == {"stored": [HASH], "known": []}
    assert upload([{"hash": HASH, "text": TEXT}]).json() == {"stored": [], "known": [HASH]}
    blob = Blob.objects.get()
    assert (blob.text, blob.size) == (TEXT, len(TEXT.encode()))
    assert post(make_batch(rank=0, seq=1, events=[compile_event()])).json()["want_blobs"] == []


def test_an_unanswered_request_is_asked_again_after_the_lease(post, settings):
    assert post(make_batch(rank=0, events=[compile_event()])).json()["want_blobs"] == [HASH]
    Blob.objects.update(requested_at=timezone.now() - timedelta(seconds=settings.LOCKSTEP_BLOB_LEASE + 1))
    assert post(make_batch(rank=1, events=[compile_event()])).json()["want_blobs"] == [HASH]


def test_wrong_hash_is_400_and_nothing_is_stored(upload):
    response = upload([{"hash": HASH, "text": TEXT}, {"hash": HASH, "text": TEXT + "tampered"}])
    assert response.status_code == 400
    assert response.json()["path"] == "blobs[1].hash"
    assert not Blob.objects.exists()


@pytest.mark.parametrize(
    "blobs, path",
    [
        ([{"hash": "XYZ", "text": "x"}], "blobs[0].hash"),
        ([{"hash": HASH}], "blobs[0].text"),
        ([], "blobs"),
    ],
)
def test_malformed_upload_is_400(upload, blobs, path):
    response = upload(blobs)
    assert response.status_code == 400
    assert response.json()["path"] == path


def test_oversized_blob_is_413(upload):
    text = "é" * (protocol.MAX_BLOB_BYTES // 2 + 1)  # within the character limit, over the byte limit
    response = upload([{"hash": protocol.blob_hash(text), "text": text}])
    assert response.status_code == 413
    assert response.json()["path"] == "blobs[0].text"


def test_upload_needs_a_token(client):
    response = client.generic("POST", "/api/v1/blobs", b"{}", content_type="application/json")
    assert response.status_code == 401


def test_a_text_nobody_asked_for_is_not_stored_and_the_answer_reveals_nothing(upload):
    """Issue 17, item 8: any token could fill the store, and learn from `known` whether another
    project's agents had sent a given graph."""
    other = "def forward(self, x):\n    return x\n"
    response = upload([{"hash": protocol.blob_hash(other), "text": other}])
    assert response.json() == {"stored": [], "known": [protocol.blob_hash(other)]}
    assert not Blob.objects.exists()


def test_texts_no_compile_names_any_more_and_requests_never_answered_are_pruned(post, upload, settings):
    from dashboard.evidence import retention

    post(make_batch(rank=0, events=[compile_event()]))
    upload([{"hash": HASH, "text": TEXT}])
    stale = "x = 1\n"
    post(make_batch(rank=1, events=[compile_event(protocol.blob_hash(stale))]))  # asked, never uploaded
    now = timezone.now()
    assert retention.prune(now=now).blobs == 0
    assert retention.prune(now=now + timedelta(days=2)).blobs == 1  # the unanswered request
    assert Blob.objects.get().hash == HASH
    later = now + timedelta(days=settings.LOCKSTEP_RAW_RETENTION_DAYS + 1)
    assert retention.prune(now=later).blobs == 1 and not Blob.objects.exists()
