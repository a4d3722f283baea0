"""Issue 39 against a real uvicorn started here with small bounds: what one connection may hold
before anyone knows who sent it. Item 4 (per-route body limits and a bound on bodies read at once),
item 5 (X-Forwarded-For believed from LOCKSTEP_TRUSTED_PROXIES only), item 7 (a websocket to an
unknown path; the rest of item 7 is in test_bad_input.py), item 9 (a header deadline).

Loopback has every 127.x.y.z: a socket bound to PROXY is the trusted proxy, one from 127.0.0.1 an
ordinary client."""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
import uuid

import pytest

from tests.security import raw_http
from tests.security.test_hostile_bodies import _rss_kib
from tests.stack import Stack, free_port, spawn, uvicorn

pytestmark = [pytest.mark.e2e]
HEADER_TIMEOUT_S = 2
BODY_TIMEOUT_S = 4
EDGE_BODIES = 20
FAILURES = 3
PROXY = "127.0.0.2"


@pytest.fixture(scope="module")
def server(stack_env, tmp_path_factory):
    port = free_port()
    env = {
        **stack_env,
        "LOCKSTEP_HEADER_TIMEOUT": str(HEADER_TIMEOUT_S),
        "LOCKSTEP_BODY_TIMEOUT": str(BODY_TIMEOUT_S),
        "LOCKSTEP_EDGE_BODIES": str(EDGE_BODIES),
        "LOCKSTEP_TRUSTED_PROXIES": f"{PROXY}/32",
        "LOCKSTEP_LOGIN_FAILURES": str(FAILURES),
        "LOCKSTEP_RETRY_AFTER": "1",
    }
    proc = spawn("uvicorn-connections", uvicorn(port), env, tmp_path_factory.mktemp("connections"))
    running = Stack(f"http://127.0.0.1:{port}", env, proc, proc)
    try:
        running.wait_http()
        yield running
    finally:
        proc.stop()


def _port(server: Stack) -> int:
    return int(server.url.rsplit(":", 1)[1])


def _open(server: Stack, head: str, body: bytes = b"", source: str = "127.0.0.1") -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", _port(server)), timeout=15, source_address=(source, 0))
    conn.sendall(head.encode() + body)
    return conn


def _post_head(path: str, length: int) -> str:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {length}\r\n\r\n"
    )


# item 4 ------------------------------------------------------------------------------------------


def test_150_stalled_8_mib_logins_are_refused_from_their_headers_and_hold_no_memory(server):
    pid = server.server.popen.pid
    before = _rss_kib(pid)
    started = time.monotonic()
    stalled = [_open(server, _post_head("/login/", 8 * 1024 * 1024 - 1), b"x" * 64 * 1024) for _ in range(150)]
    answers = [raw_http.answer(conn) for conn in stalled]
    waited = time.monotonic() - started
    held = _rss_kib(pid) - before
    print(f"\n150 stalled 8 MiB logins: all answered in {waited:.2f} s, server RSS +{held / 1024:.1f} MiB")
    assert {status for status, _ in answers} == {413}
    assert all(b"body exceeds 4096 bytes" in answer for _, answer in answers)
    assert waited < BODY_TIMEOUT_S  # from the headers: none waited for its body
    assert held < 32 * 1024  # KiB


def test_bodies_read_at_once_are_bounded_and_past_the_bound_refused_at_once(server):
    stalled = [_open(server, _post_head("/login/", 4000), b"username=a") for _ in range(EDGE_BODIES)]
    time.sleep(0.5)  # every one of them is being read
    started = time.monotonic()
    status, answer = raw_http.answer(_open(server, _post_head("/login/", 4000), b"username=b"))
    assert status == 503 and re.search(rb"retry-after: 1\r\n", answer, re.I)
    assert time.monotonic() - started < 1
    page, _ = raw_http.answer(_open(server, "GET /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
    assert page == 200  # a request without a body takes no slot
    assert {raw_http.answer(conn)[0] for conn in stalled} == {408}  # each cut at the body deadline, its slot freed
    status, _ = raw_http.answer(_open(server, _post_head("/login/", 10), b"username=c"))
    assert status == 403  # read and handed to Django (no CSRF token: its 403)


# item 5 ------------------------------------------------------------------------------------------


def _login(server: Stack, user: str, source: str = "127.0.0.1", forwarded: str | None = None) -> int:
    """A wrong password for `user` from `source`, saying X-Forwarded-For: `forwarded`; the status."""
    extra = {"X-Forwarded-For": forwarded} if forwarded else {}
    conn = http.client.HTTPConnection("127.0.0.1", _port(server), timeout=15, source_address=(source, 0))
    conn.request("GET", "/login/", headers=extra)
    page = conn.getresponse()
    page.read()
    csrf = re.search(r"csrftoken=([^;]+)", page.getheader("Set-Cookie", "")).group(1)
    form = f"username={user}&password=wrong&csrfmiddlewaretoken={csrf}"
    headers = {"Cookie": f"csrftoken={csrf}", "Content-Type": "application/x-www-form-urlencoded", **extra}
    conn.request("POST", "/login/", body=form, headers=headers)
    status = conn.getresponse().status
    conn.close()
    return status


def _users(n: int) -> list[str]:
    return [f"nobody-{uuid.uuid4().hex[:8]}" for _ in range(n)]  # each a first try: only the address counts


def test_a_spoofed_forwarded_for_changes_nothing_from_a_client_and_names_the_client_from_a_proxy(server, live_db):
    from axes.utils import reset

    try:
        spoofed = [_login(server, user, forwarded=f"203.0.113.{i}") for i, user in enumerate(_users(FAILURES))]
        assert spoofed == [200] * (FAILURES - 1) + [429]  # the form again with its error, then locked out
        assert _login(server, _users(1)[0], forwarded="203.0.113.99") == 429  # 127.0.0.1 is locked out
        assert _login(server, _users(1)[0], source=PROXY, forwarded="203.0.113.0") == 200  # no spoofed one is

        via_proxy = [_login(server, user, source=PROXY, forwarded="6.6.6.6, 198.51.100.1") for user in _users(FAILURES)]
        assert via_proxy == [200] * (FAILURES - 1) + [429]
        assert _login(server, _users(1)[0], source=PROXY, forwarded="198.51.100.1") == 429  # the client the proxy saw
        assert _login(server, _users(1)[0], source=PROXY, forwarded="6.6.6.6, 198.51.100.2") == 200  # not the proxy
    finally:
        reset()


# item 7 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/ws/nowhere/", "/ws/runs/a/b/", "/", "/api/v1/runs"])
def test_a_websocket_to_an_unknown_path_is_a_404_naming_it(server, path):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    with pytest.raises(InvalidStatus) as refused:
        connect(server.url.replace("http", "ws") + path, open_timeout=10, additional_headers={"Origin": server.url})
    answer = refused.value.response
    assert answer.status_code == 404
    assert json.loads(answer.body) == {"error": f"no websocket at {path}", "path": "path"}
    assert "Exception" not in server.server.tail()  # nothing raised on the server


# item 9 ------------------------------------------------------------------------------------------


def _closed_after(conn: socket.socket, trickle: bytes, limit: float) -> float:
    """Seconds until the server closes `conn` while it sends `trickle` a byte every 0.2 s."""
    started = time.monotonic()
    conn.settimeout(0.2)
    for byte in trickle * 100:
        try:
            conn.sendall(bytes([byte]))
            if conn.recv(1024) == b"":
                break
        except TimeoutError:
            pass
        except OSError:  # reset: closed while we sent
            break
        assert time.monotonic() - started < limit, "still open"
    conn.close()
    return time.monotonic() - started


def test_a_connection_sending_its_headers_slowly_is_closed_at_the_header_deadline(server):
    slow = _open(server, "GET /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    took = _closed_after(slow, b"X-Slow: still coming\r\n", HEADER_TIMEOUT_S + 3)
    assert HEADER_TIMEOUT_S - 0.5 <= took < HEADER_TIMEOUT_S + 2

    silent = [_open(server, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-") for _ in range(200)]
    time.sleep(HEADER_TIMEOUT_S + 1)
    for conn in silent:
        conn.settimeout(5)
        assert conn.recv(1024) == b""  # every one closed, none answered
        conn.close()


def test_headers_past_64_kib_are_a_431_and_hold_no_memory(server):
    pid = server.server.popen.pid
    before = _rss_kib(pid)
    endless = [_open(server, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ") for _ in range(5)]
    for conn in endless:
        try:
            for _ in range(64):  # 4 MiB each, if the server kept reading
                conn.sendall(b"a" * 65536)
        except OSError:  # reset: closed while we sent
            pass
    held = _rss_kib(pid) - before
    for conn in endless:
        conn.settimeout(5)
        try:
            assert conn.recv(200).startswith(b"HTTP/1.1 431 ")
        except ConnectionResetError:  # the answer was lost to the reset of what we kept sending
            pass
        conn.close()
    print(f"\n5 endless headers: server RSS +{held / 1024:.1f} MiB")
    assert held < 16 * 1024  # KiB
    normal = http.client.HTTPConnection("127.0.0.1", _port(server), timeout=15)
    normal.request("GET", "/login/", headers={"X-Fair": "b" * 16_000})
    assert normal.getresponse().status == 200  # big, but within the bound
    normal.close()


def test_a_keep_alive_client_that_keeps_up_outlives_the_header_deadline(server):
    conn = http.client.HTTPConnection("127.0.0.1", _port(server), timeout=15)
    started = time.monotonic()
    statuses, sockets = [], set()
    while time.monotonic() - started < 2 * HEADER_TIMEOUT_S + 1:
        conn.request("GET", "/login/")
        answer = conn.getresponse()
        answer.read()
        statuses.append(answer.status)
        sockets.add(conn.sock)
        time.sleep(0.3)
    conn.close()
    assert set(statuses) == {200} and len(sockets) == 1  # one connection throughout
