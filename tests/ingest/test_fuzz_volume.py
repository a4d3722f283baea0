"""Reliability drill: 10,000 bad requests of every kind against the ingest endpoint; every one is
a 4xx with a JSON error, nothing is stored, and the server still accepts a good batch after."""

from __future__ import annotations

import gzip
import json
import random
import uuid
from collections import Counter

import pytest

from tests.conftest import make_batch
from tests.ingest.test_fuzz import stored

pytestmark = pytest.mark.django_db
N = 10_000


def bad_request(rng: random.Random) -> tuple[bytes, dict]:
    """One request that must be refused: (body, extra headers)."""
    batch = make_batch(session=str(uuid.uuid4()), events=[{"t": "grad", "step": 1, "fps": [1, 2]}])
    kind = rng.randrange(10)
    if kind == 0:
        batch[rng.choice(["rank", "seq", "v"])] = rng.choice(["x", None, [], {}, 1.5, -1])
    elif kind == 1:
        batch["events"][0]["step"] = rng.choice(["1", -1, 1 << 70, None, [1]])
    elif kind == 2:
        batch["rank"] = rng.choice([-1, 3, 1 << 40])
    elif kind == 3:
        batch["events"].append({"t": rng.choice(["", "gradz", "GRAD", "\x00"]), "step": 1})
    elif kind == 4:
        del batch[rng.choice(["v", "run", "rank", "session", "seq", "events"])]
    elif kind == 5:
        batch["events"][0]["fps"] = [rng.choice([-1, 1 << 64, "f", 0.5])]
    raw = json.dumps(batch).encode()
    if kind == 6:
        return raw[: rng.randrange(1, len(raw) - 1)], {}
    if kind == 7:
        return b"\xff" + rng.randbytes(rng.randrange(0, 200)), {}
    if kind == 8:
        return gzip.compress(raw)[: -rng.randrange(1, 12)], {"HTTP_CONTENT_ENCODING": "gzip"}
    if kind == 9:
        return raw, rng.choice(
            [{"CONTENT_TYPE": "text/plain"}, {"HTTP_AUTHORIZATION": "Bearer nope"}, {"HTTP_CONTENT_ENCODING": "br"}]
        )
    return raw, {}


def test_ten_thousand_bad_requests_are_refused_and_store_nothing(client, token, record_property):
    rng = random.Random(20261130)
    before = stored()
    statuses: Counter[int] = Counter()
    for _ in range(N):
        body, headers = bad_request(rng)
        extra = {"HTTP_AUTHORIZATION": f"Bearer {token}", "CONTENT_TYPE": "application/json", **headers}
        response = client.generic("POST", "/api/v1/ingest", body, **extra)
        statuses[response.status_code] += 1
        assert 400 <= response.status_code < 500, (response.status_code, body[:200], headers)
        assert response.json()["error"]
    assert stored() == before
    good = client.post(
        "/api/v1/ingest", make_batch(), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert good.status_code == 200
    record_property("bad_requests", N)
    record_property("statuses", dict(sorted(statuses.items())))
    record_property("stored", 0)
