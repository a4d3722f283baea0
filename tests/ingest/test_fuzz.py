"""Hostile input, fuzzed with hypothesis: never a 500, a JSON error naming the field, nothing stored.

Each example mutates a valid batch (any value anywhere replaced by hostile JSON, keys dropped,
unknown event types, world size changed within the run) or sends arbitrary / truncated bytes.
"""

from __future__ import annotations

import gzip
import json
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents import protocol
from dashboard.evidence.models import CompileEvent, EventLog, GradReport, StepReport
from dashboard.tenancy.models import Rank
from tests import claims
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

hostile_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.sampled_from([-1, 0, 1 << 31, 1 << 63, 1 << 64, (1 << 62) + 1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e308, -1e308, 4e9, 3.3e10]),
    st.text(max_size=40),
    st.sampled_from(["", "\x00", "a\x00b", "g" * 600, "ddp", "grad", "🙂"]),
)
hostile = st.recursive(
    hostile_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)


def valid_events() -> list[dict]:
    return [
        {"t": "rank_start", "host": "h", "pid": 1, "versions": {"torch": "2.13.0"}},
        {
            "t": "compile",
            "frame": "m.py:1:f",
            "index": 0,
            "step": 0,
            "status": "ok",
            "compile_id": "0/0",
            "hashes": {"dynamo": {"raw": "a" * 32, "norm": "b" * 32}},
            "times": {"entire_frame_compile_time_s": 1.0},
        },
        {"t": "grad", "step": 0, "fps": [1, 2]},
        protocol.msgspec.to_builtins(protocol.Grads.pack(1, [[1, 2], [3, 4]])),
        {"t": "step", "step": 0, "loss": 0.5},
        {"t": "rank_end", "status": "ok", "exit_code": 0},
    ]


def paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, prefix + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from paths(item, prefix + (i,))


def replace(doc, path, new):
    if not path:
        return new
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = new
    return doc


def drop(doc, path):
    target = doc
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return doc


@st.composite
def mutated_batches(draw):
    batch = make_batch(session=str(uuid.uuid4()), events=valid_events(), world_size=4, rank=draw(st.integers(0, 3)))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(paths(batch))))
        action = draw(st.sampled_from(["replace", "drop", "event"]))
        if action == "drop" and path:
            batch = drop(batch, path)
        elif action == "event" and isinstance(batch, dict) and isinstance(batch.get("events"), list):
            batch["events"].append({"t": draw(st.text(max_size=12)), "step": draw(hostile)})
        else:
            batch = replace(batch, path, draw(hostile))
    return batch


def stored() -> tuple[int, ...]:
    return (claims.count(), *(m.objects.count() for m in (Rank, GradReport, CompileEvent, StepReport, EventLog)))


def check_answer(response, before):
    assert response.status_code != 500, response.content
    assert response.status_code in (200, 400, 403, 409, 413, 415), response.content
    body = response.json()
    if response.status_code == 200:
        return
    assert body["error"]
    assert stored() == before, "a rejected batch stored something"


@FUZZ
@given(batch=mutated_batches(), gz=st.booleans())
def test_mutated_batches_never_500_and_rejections_store_nothing(post, batch, gz):
    before = stored()
    response = post(json.dumps(batch, allow_nan=False).encode(), gzip_=gz)
    check_answer(response, before)
    if response.status_code == 400 and isinstance(batch, dict) and isinstance(batch.get("events"), list):
        assert "path" in response.json() or "JSON" in response.json()["error"]


@FUZZ
@given(raw=st.binary(max_size=300))
def test_arbitrary_bytes(post, raw):
    before = stored()
    check_answer(post(raw), before)


@FUZZ
@given(cut=st.integers(min_value=1, max_value=60))
def test_truncated_gzip(post, cut):
    raw = gzip.compress(json.dumps(make_batch(session=str(uuid.uuid4()))).encode())
    before = stored()
    response = post(raw[:-cut], headers={"HTTP_CONTENT_ENCODING": "gzip"})
    assert response.status_code == 400
    assert stored() == before


@pytest.mark.parametrize(
    "event, path",
    [
        ({"t": "grad", "step": 0, "fps": [1], "group": "g" * 65}, "events[0].group"),
        ({"t": "step", "step": 0, "ts": 1e300}, "events[0].ts"),
        ({"t": "step", "step": 0, "ts": -5}, "events[0].ts"),
        ({"t": "compile", "frame": "f", "index": 1 << 40}, "events[0].index"),
        ({"t": "compile", "frame": "f", "status": "s" * 17}, "events[0].status"),
        ({"t": "rank_end", "exit_code": 1 << 40}, "events[0].exit_code"),
        ({"t": "step", "step": 1 << 63}, "events[0].step"),
        ({"t": "graph_break", "frame": "f", "reason": "a\x00b"}, "events[0].reason"),
        ({"t": "rank_start", "versions": {"torch": "\x00"}}, "events[0].versions.torch"),
    ],
)
def test_values_the_database_cannot_hold_are_400_naming_the_field(post, event, path):
    before = stored()
    response = post(make_batch(events=[event]))
    assert response.status_code == 400, response.content
    assert response.json()["path"] == path
    assert stored() == before


def test_world_size_change_and_conflicting_resend(post):
    assert post(make_batch(world_size=3)).status_code == 200
    assert post(make_batch(world_size=5, seq=1)).json()["path"] == "run.world_size"
    assert post(make_batch(events=[{"t": "grad", "step": 0, "fps": [2]}])).status_code == 409


def test_server_stays_healthy_after_hostile_input(post):
    for raw in (b"\xff" * 100, b'{"v":1,"events":' * 500, json.dumps(make_batch(rank=-1)).encode()):
        assert post(raw).status_code == 400
    assert post(make_batch(session=str(uuid.uuid4()))).status_code == 200


def test_openapi_schema_describes_the_api(client):
    schema = client.get("/api/v1/schema").json()
    assert schema["openapi"].startswith("3.1")
    assert set(schema["paths"]) == {"/api/v1/ingest", "/api/v1/ingest/bulk", "/api/v1/blobs", "/api/v1/flight-recorder"}
    components = schema["components"]["schemas"]
    assert {
        "Batch",
        "Grads",
        "Grad",
        "Compile",
        "BlobUpload",
        "IngestReply",
        "Bulk",
        "BulkReply",
        "FlightRecord",
        "FlightRecordReply",
        "Error",
    } <= set(components)
    bulk = schema["paths"]["/api/v1/ingest/bulk"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert bulk == {"$ref": "#/components/schemas/Bulk"}
    responses = schema["paths"]["/api/v1/ingest"]["post"]["responses"]
    assert {"200", "400", "409", "413", "429", "503"} <= set(responses)


@FUZZ
@given(
    batches=st.lists(
        mutated_batches()
        | st.builds(lambda r: make_batch(rank=r, world_size=4, session=str(uuid.uuid4())), st.integers(0, 3)),
        min_size=1,
        max_size=4,
    ),
    gz=st.booleans(),
)
def test_mutated_bulk_requests_never_500_and_rejections_store_nothing(client, token, batches, gz):
    body = protocol.bulk_body([json.dumps(b, allow_nan=False).encode() for b in batches])
    before = stored()
    response = client.generic(
        "POST",
        "/api/v1/ingest/bulk",
        gzip.compress(body) if gz else body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
        **({"HTTP_CONTENT_ENCODING": "gzip"} if gz else {}),
    )
    check_answer(response, before)
    if response.status_code == 200:
        assert len(response.json()["results"]) == len(batches)
    elif response.json().get("path"):
        path = response.json()["path"]
        assert path == "batches" or int(path.removeprefix("batches[").split("]")[0]) < len(batches), path
