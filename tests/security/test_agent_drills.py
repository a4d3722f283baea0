"""A real agent (agents.transport) against the running stack while the way to it misbehaves:
its token rotated mid-job, a proxy answering 404 and then 413 mid-job. Nothing may be lost or
stored twice; the figures (attempts, refusals, events lost) go to the README's reliability table."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agents import protocol
from agents.config import resolve
from agents.spool import list_batches
from agents.transport import Transport
from dashboard.evidence.models import StepReport
from dashboard.tenancy.models import ProjectToken, Run
from ingest.admission import TOKEN_CACHE_S
from tests.e2e.jobs import project_with_token
from tests.stack import ROOT, unique

pytestmark = [pytest.mark.e2e]
STEPS = 40


@pytest.fixture(autouse=True)
def quick_flush(monkeypatch):
    monkeypatch.setenv("LOCKSTEP_FLUSH_INTERVAL", "0.05")
    monkeypatch.setenv("LOCKSTEP_HEARTBEAT", "1000")


def _agent(url: str, token: str, key: str, spool) -> Transport:
    return Transport(resolve(url=url, token=token, run=key, rank=0, world_size=1, spool_dir=str(spool)))


def _stored(key: str) -> list[int]:
    return sorted(StepReport.objects.filter(run__key=key).values_list("step", flat=True))


def _wait(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_a_token_rotated_mid_job_loses_nothing(stack, live_db, tmp_path, record_property):
    project, old = project_with_token("rotating")
    key = unique("rotation")
    agent = _agent(stack.url, old, key, tmp_path / "spool")
    for step in range(STEPS // 2):
        agent.put(protocol.Step(step=step))
    _wait(lambda: len(_stored(key)) == STEPS // 2)
    ProjectToken.objects.filter(project=project).delete()  # rotated: the old token is revoked ...
    new = ProjectToken.issue(project)  # ... and the job's operator gets a new one
    time.sleep(TOKEN_CACHE_S + 0.5)  # every server process has forgotten the old one
    for step in range(STEPS // 2, STEPS):
        agent.put(protocol.Step(step=step))
    agent.close(timeout=2)
    record_property("through", sum(step >= STEPS // 2 for step in _stored(key)))
    assert _stored(key) == list(range(STEPS // 2))  # nothing after the revocation got in
    assert agent.stats["dropped_events"] == 0 and list_batches(str(tmp_path / "spool"))
    upload = subprocess.run(
        [sys.executable, "-m", "agents", "upload", str(tmp_path / "spool"), "--url", stack.url, "--token", new],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert upload.returncode == 0, upload.stderr
    stored = _stored(key)
    record_property("events_lost", STEPS - len(set(stored)))
    print(
        f"\ntoken rotation: {STEPS} steps, {len(stored)} stored ({len(set(stored))} distinct) after upload with the new token"
    )
    assert stored == list(range(STEPS))  # none lost, none twice
    assert Run.objects.filter(key=key).count() == 1


class Proxy:
    """A reverse proxy in front of the stack (the outside edge) that can answer 404 for every
    request, or 413 for bodies over `max_body` bytes, for a while."""

    def __init__(self, upstream: str) -> None:
        self.mode = "forward"
        self.max_body = 10**9
        self.refused = {404: 0, 413: 0}
        self.forwarded = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if proxy.mode == "404" or (proxy.mode == "413" and len(body) > proxy.max_body):
                    status = 404 if proxy.mode == "404" else 413
                    proxy.refused[status] += 1
                    self._answer(status, b"<html>nginx</html>", "text/html")
                    return
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() in ("authorization", "content-type", "content-encoding")
                }
                request = urllib.request.Request(upstream + self.path, data=body, headers=headers, method="POST")
                try:
                    with urllib.request.urlopen(request, timeout=10) as answer:
                        status, data, kind = answer.status, answer.read(), answer.headers.get("Content-Type", "")
                except urllib.error.HTTPError as exc:
                    status, data, kind = exc.code, exc.read(), exc.headers.get("Content-Type", "")
                proxy.forwarded += 1
                self._answer(status, data, kind)

            def _answer(self, status: int, data: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind or "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_proxy_answering_404_then_413_mid_job_loses_nothing(stack, live_db, tmp_path, record_property):
    _, token = project_with_token("proxied")
    key = unique("proxied")
    proxy = Proxy(stack.url)
    try:
        agent = _agent(proxy.url, token, key, tmp_path / "spool")
        for step in range(10):
            agent.put(protocol.Step(step=step, loss=1.0, step_time=0.1))
        _wait(lambda: len(_stored(key)) == 10)
        proxy.mode = "404"  # a misrouted proxy
        for step in range(10, 20):
            agent.put(protocol.Step(step=step, loss=1.0, step_time=0.1))
        _wait(lambda: proxy.refused[404] >= 2)
        proxy.mode, proxy.max_body = "413", 300  # then a body limit far below the server's
        for step in range(20, STEPS):
            agent.put(protocol.Step(step=step, loss=1.0, step_time=0.1))
        _wait(lambda: proxy.refused[413] >= 1)
        agent.close(timeout=30)
    finally:
        proxy.close()
    stored = _stored(key)
    record_property("events_lost", STEPS - len(set(stored)))
    record_property("refused", f"{proxy.refused[404]} x 404, {proxy.refused[413]} x 413")
    print(
        f"\nproxy drill: {proxy.refused[404]} answered 404, {proxy.refused[413]} answered 413, "
        f"{proxy.forwarded} forwarded; {len(stored)} of {STEPS} steps stored ({len(set(stored))} distinct)"
    )
    assert stored == list(range(STEPS))
    assert agent.stats["dropped_events"] == 0 and not list_batches(str(tmp_path / "spool"))
