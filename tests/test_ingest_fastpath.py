"""The lean route (ingest.fastpath) answers exactly as Django does, from the one route table in dashboard/urls.py."""
from __future__ import annotations

import asyncio
import gzip
import json
import time

import psycopg
import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application
from django.db import connection
from django.urls import URLPattern, get_resolver, resolve, reverse

from agents import protocol
from ingest import backpressure, views
from ingest.fastpath import LeanRoutes, is_lean
from ingest.models import GradReport, IngestBatch
from tests.conftest import make_batch, per_rank
from tests.stack import database_url

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def route():
    app = LeanRoutes(get_asgi_application(), threads=2)
    handler = app.handler  # a test may wrap it
    yield app
    handler.shutdown()  # its threads' connections to the test database


@pytest.fixture
def lean_served(route, monkeypatch) -> list[str]:
    """Paths the lean handler served (the rest went to Django's ASGI handler)."""
    served: list[str] = []
    handler = route.handler

    async def spy(scope, receive, send):
        served.append(scope["path"])
        await handler(scope, receive, send)

    monkeypatch.setattr(route, "handler", spy)
    monkeypatch.setattr(route.loop, "lean", spy)  # what the event loop's endpoints hand to the lean route
    return served


def call(app, body: bytes, headers: dict[str, str], method: str = "POST", path: str = "/api/v1/ingest",
         chunks: int = 1):
    return async_to_sync(acall)(app, body, headers, method, path, chunks)


async def acall(app, body: bytes, headers: dict[str, str], method: str = "POST", path: str = "/api/v1/ingest",
                chunks: int = 1, scheme: str = "http"):
    """One request through the ASGI app on the running loop: (status, headers, body)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": scheme,
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
    comm = ApplicationCommunicator(app, scope)
    step = max(1, -(-len(body) // chunks))
    parts = [body[i:i + step] for i in range(0, len(body), step)] or [b""]
    for i, part in enumerate(parts):
        await comm.send_input({"type": "http.request", "body": part, "more_body": i < len(parts) - 1})
    start = await comm.receive_output(30)
    content = b""
    while True:
        message = await comm.receive_output(30)
        content += message.get("body", b"")
        if not message.get("more_body"):
            break
    return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, content


def headers_for(token: str | None, content_type: str = "application/json", **extra) -> dict[str, str]:
    headers = {"Host": "127.0.0.1:8000", "Content-Type": content_type}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    headers.update(extra)
    return headers


def test_accepts_and_stores_then_resend_is_duplicate(route, token):
    batch = make_batch(events=[{"t": "grad", "step": 0, "fps": [1, 2, 3]}, {"t": "grad", "step": 1, "fps": [4, 5, 6]}])
    body = json.dumps(batch).encode()
    status, headers, content = call(route, body, headers_for(token))
    assert status == 200, content
    assert json.loads(content) == {"accepted": 2, "duplicate": False, "want_blobs": [], "detail": []}
    assert headers["content-type"] == "application/json"
    assert headers["content-length"] == str(len(content))
    assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"
    assert GradReport.objects.count() == 2
    status, _, content = call(route, gzip.compress(body), headers_for(token, **{"Content-Encoding": "gzip"}), chunks=3)
    assert status == 200 and json.loads(content)["duplicate"] is True
    assert GradReport.objects.count() == 2 and IngestBatch.objects.count() == 1


def test_bulk_takes_the_route_too(route, token):
    body = protocol.bulk_body([json.dumps(make_batch(rank=r)).encode() for r in range(2)])
    status, _, content = call(route, body, headers_for(token), path="/api/v1/ingest/bulk")
    assert status == 200, content
    assert [r["accepted"] for r in json.loads(content)["results"]] == [1, 1]
    assert [rank for rank, _, _ in per_rank(GradReport.objects)] == [0, 1] and IngestBatch.objects.count() == 2
    status, _, content = call(route, protocol.bulk_body([b"{}"]), headers_for(token), path="/api/v1/ingest/bulk")
    assert status == 400 and json.loads(content)["path"].startswith("batches[0].")


@pytest.mark.parametrize(
    "body, hdrs, status",
    [
        (json.dumps(make_batch(events=[{"t": "grad", "step": "x"}])).encode(), {}, 400),
        (b"{not json", {}, 400),
        (json.dumps(make_batch()).encode(), {"token": None}, 401),
        (json.dumps(make_batch()).encode(), {"content_type": "text/plain"}, 415),
        (json.dumps(make_batch()).encode(), {"Content-Encoding": "br"}, 415),
        (gzip.compress(json.dumps(make_batch()).encode())[:-8], {"Content-Encoding": "gzip"}, 400),
    ],
)
def test_errors_are_the_django_views_errors(route, client, token, body, hdrs, status):
    hdrs = dict(hdrs)
    tok = hdrs.pop("token", token)
    content_type = hdrs.pop("content_type", "application/json")
    got_status, got_headers, got = call(route, body, headers_for(tok, content_type, **hdrs))
    extra = {"HTTP_AUTHORIZATION": f"Bearer {tok}"} if tok else {}
    extra.update({f"HTTP_{k.upper().replace('-', '_')}": v for k, v in hdrs.items()})
    django = client.generic("POST", "/api/v1/ingest", body, content_type=content_type, **extra)
    assert got_status == django.status_code == status
    assert json.loads(got) == django.json() and "error" in django.json()
    assert got_headers["content-type"] == django["Content-Type"]
    assert {k: v for k, v in got_headers.items() if k != "content-length"} == \
        {k.lower(): v for k, v in django.headers.items() if k.lower() != "content-length"}  # the lean chain adds what the full one does
    assert not IngestBatch.objects.exists()


def test_too_large_is_413_before_and_after_inflating(route, token, settings):
    settings.LOCKSTEP_MAX_BODY = 400
    raw = json.dumps(make_batch(events=[{"t": "grad", "step": 0, "fps": [1, 2, 3]}] * 100)).encode()
    assert len(gzip.compress(raw)) < 400 < len(raw)
    status, _, content = call(route, raw, headers_for(token), chunks=4)
    assert status == 413 and "exceeds" in json.loads(content)["error"]
    status, _, content = call(route, gzip.compress(raw), headers_for(token, **{"Content-Encoding": "gzip"}))
    assert status == 413 and "decompressed" in json.loads(content)["error"]


def test_rate_limit_keeps_retry_after(route, token, settings):
    settings.LOCKSTEP_RATE_LIMIT = 1
    answers = [call(route, json.dumps(make_batch(seq=i)).encode(), headers_for(token)) for i in range(3)]
    limited = [a for a in answers if a[0] == 429]
    assert limited and limited[0][1]["retry-after"] == "1"


def test_other_methods_and_bad_hosts_get_djangos_answers(route, lean_served, token):
    status, headers, _ = call(route, b"", headers_for(token), method="GET")
    assert status == 405 and "POST" in headers["allow"]
    status, _, _ = call(route, json.dumps(make_batch()).encode(), headers_for(token, Host="evil.example"))
    assert status == 400  # DisallowedHost, from the same middleware chain Django runs
    assert lean_served == ["/api/v1/ingest"] * 2 and not IngestBatch.objects.exists()


def test_the_lean_chain_leaves_out_the_browser_middlewares(route, token, settings):
    """A session cookie, a CSRF check or a static-file lookup never applies to an agent's batch."""
    assert "django.contrib.sessions.middleware.SessionMiddleware" in settings.MIDDLEWARE
    assert not set(settings.LEAN_MIDDLEWARE) - set(settings.MIDDLEWARE)
    status, headers, _ = call(route, json.dumps(make_batch()).encode(),
                              headers_for(token, Cookie="sessionid=forged; csrftoken=x"))
    assert status == 200 and "set-cookie" not in headers and "vary" not in headers
    assert route.handler._view_middleware == []  # CsrfViewMiddleware (a view middleware) is not loaded


def test_other_routes_go_to_djangos_asgi_handler(route, lean_served, token):
    status, _, content = call(route, b"", headers_for(token), method="GET", path="/api/v1/schema")
    assert status == 200 and json.loads(content)["openapi"]
    status, _, _ = call(route, b"", headers_for(token), method="GET", path="/no/such/route")
    assert status == 404
    assert lean_served == []


def _scope(path: str, root_path: str = "") -> dict:
    return {"type": "http", "path": path, "root_path": root_path}


def test_lean_routes_are_the_marked_routes_of_dashboard_urls():
    marked = {p.name for p in get_resolver().url_patterns
              if isinstance(p, URLPattern) and getattr(p.callback, "lean_route", False)}
    assert marked == {"ingest", "ingest-bulk", "blobs"}
    for name in marked:
        path = reverse(name)
        assert is_lean(_scope(path)) and is_lean(_scope("/prefix" + path, root_path="/prefix"))
        assert resolve(path).url_name == name  # what Django's handler runs is what the lean route runs
    for path in (reverse("api-runs"), reverse("metrics"), "/", "/api/v1/ingest/", "/no/such/route"):
        assert not is_lean(_scope(path))


def test_a_route_removed_from_urls_is_gone_from_both_paths(route, lean_served, client, token, settings):
    settings.ROOT_URLCONF = "tests.urls_without_ingest"
    body = json.dumps(make_batch()).encode()
    status, _, _ = call(route, body, headers_for(token))
    assert status == 404 and lean_served == []
    assert client.generic("POST", "/api/v1/ingest", body, content_type="application/json",
                          HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 404
    bulk = protocol.bulk_body([body])
    status, _, content = call(route, bulk, headers_for(token), path="/api/v1/ingest/bulk")
    assert status == 200 and json.loads(content)["results"][0]["accepted"] == 1
    assert lean_served == []  # served on the event loop, still found through the one route table


def _unanswered_body(app, headers: dict[str, str], first: bytes | None = None, path: str = "/api/v1/ingest"):
    """Send the headers (and `first`, a part of a body that never ends) but never the rest: the
    answer must come without the body, or the call times out."""
    async def run():
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
                 "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
                 "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
        comm = ApplicationCommunicator(app, scope)
        if first is not None:
            await comm.send_input({"type": "http.request", "body": first, "more_body": True})
        start = await comm.receive_output(10)
        body = await comm.receive_output(10)
        await comm.send_input({"type": "http.disconnect"})
        return start["status"], json.loads(body["body"])

    return async_to_sync(run)()


@pytest.mark.parametrize("path", ["/api/v1/ingest", "/api/v1/ingest/bulk", "/api/v1/blobs"])
def test_a_bad_token_or_an_oversized_length_is_refused_before_the_body_is_read(route, token, path, settings):
    """Issue 17, item 6: nobody without a token makes the server hold (or wait for) 8 MiB."""
    assert _unanswered_body(route, headers_for(None, **{"Content-Length": "8000000"}), path=path)[0] == 401
    assert _unanswered_body(route, headers_for("lst_forged", **{"Content-Length": "8000000"}), path=path)[0] == 401
    assert views._cached_project("lst_forged") is None  # a bad token is remembered: a flood of them is no flood of queries
    assert _unanswered_body(route, headers_for(token, **{"Content-Length": str(settings.LOCKSTEP_MAX_BODY + 1)}),
                            path=path) == (413, {"error": f"body exceeds {settings.LOCKSTEP_MAX_BODY} bytes"})
    assert _unanswered_body(route, headers_for(token, **{"Content-Length": "-1"}), path=path)[0] == 400


def test_a_body_that_stalls_is_a_408_after_the_read_timeout(route, token, settings):
    settings.LOCKSTEP_BODY_TIMEOUT = 0.3
    status, answer = _unanswered_body(route, headers_for(token, **{"Content-Length": "5000"}), first=b'{"v": 1')
    assert status == 408 and "0.3 s" in answer["error"]
    assert not IngestBatch.objects.exists()


def test_json_nested_too_deeply_is_a_400(route, token):
    body = b'{"v": 1, "run": {"key": "deep", "world_size": 1, "meta": {"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}}"
    status, _, content = call(route, body, headers_for(token))
    assert status == 400 and "error" in json.loads(content)


def test_while_the_oldest_queued_request_is_past_shedding_a_new_one_is_refused_at_once(token, monkeypatch):
    """One group held in PostgreSQL (a table lock another session holds); a second batch queues for
    the next group past SHED_AFTER_S; a third is answered 503 + Retry-After at once while the group
    is still held, its body unread, and the queued one is shed unstored when its turn comes. All on
    one event loop, as a server process runs them."""
    monkeypatch.setattr(backpressure, "SHED_AFTER_S", 0.3)
    app = LeanRoutes(get_asgi_application(), threads=1)
    committer = app.loop.committer
    locker = psycopg.connect(database_url(connection.settings_dict))
    locker.execute(f"LOCK TABLE {IngestBatch._meta.db_table} IN EXCLUSIVE MODE")

    async def until(condition) -> None:
        deadline = time.monotonic() + 20
        while not condition():
            assert time.monotonic() < deadline, "condition not reached"
            await asyncio.sleep(0.01)

    async def scenario():
        held = asyncio.create_task(acall(app, json.dumps(make_batch(rank=0)).encode(), headers_for(token)))
        await until(lambda: committer.writing)
        waiting = asyncio.create_task(acall(app, json.dumps(make_batch(rank=1)).encode(), headers_for(token)))
        await until(lambda: committer.queue)
        await asyncio.sleep(backpressure.SHED_AFTER_S + 0.2)
        refused = await acall(app, json.dumps(make_batch(rank=2)).encode(), headers_for(token))
        still_held = not held.done()
        locker.commit()
        return (await held)[0], (await waiting)[0], refused, still_held

    try:
        held, waiting, (status, headers, _), still_held = async_to_sync(scenario)()
    finally:
        locker.close()
        app.shutdown()
    assert status == 503 and int(headers["retry-after"]) >= 1 and still_held  # answered without waiting for the group
    assert (held, waiting) == (200, 503)
    assert list(IngestBatch.objects.values_list("rank", flat=True)) == [0]


def _wait(condition, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)
