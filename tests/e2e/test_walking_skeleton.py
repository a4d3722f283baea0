"""The whole path, real parts only: a 3-rank gloo torchrun job with DDP(torch.compile(model)) and the
agent -> uvicorn (ASGI, Channels) -> PostgreSQL -> Celery worker -> Redis channel layer -> websocket
and the run page in headless Chromium.

Rank 1 gets a 17-row batch at step 3 (it alone recompiles) and nudges one gradient at step 9.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest
import requests
from django.contrib.auth.models import User
from django.test import Client
from websockets.sync.client import connect

from ingest.models import Project, ProjectToken
from tests.browser import chromium_page
from tests.stack import ROOT, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SHAPE_STEP, PERTURB_STEP, STEPS = 3, 9, 12


class Feed(threading.Thread):
    """Collects every alert message from a websocket until told to stop."""

    def __init__(self, url: str, headers: dict) -> None:
        super().__init__(daemon=True)
        self.ws = connect(url, additional_headers=headers, open_timeout=10)
        self.alerts: list[dict] = []
        self.closed_by: Exception | None = None

    def run(self) -> None:
        try:
            for raw in self.ws:
                message = json.loads(raw)
                if message["type"] == "alert":
                    self.alerts.append(message["alert"])
        except Exception as exc:  # reported by wait_for
            self.closed_by = exc

    def wait_for(self, kinds: set[str], timeout: float) -> dict[str, dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = {a["kind"]: a for a in self.alerts if a["kind"] in kinds}
            if set(found) == kinds:
                return found
            time.sleep(0.2)
        raise AssertionError(f"alerts {kinds} not all received; got {self.alerts}; socket closed by {self.closed_by!r}")


def launch_job(stack, token: str, run_key: str, spool) -> subprocess.Popen:
    env = dict(stack.env, LOCKSTEP_URL=stack.url, LOCKSTEP_TOKEN=token, LOCKSTEP_RUN=run_key,
               LOCKSTEP_SPOOL_DIR=str(spool), OMP_NUM_THREADS="1")
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-port", str(free_port()),
            "-m", "agents", "run", "demo/ddp_job.py", "--steps", str(STEPS), "--sleep", "0.4",
            "--shape-rank", "1", "--shape-step", str(SHAPE_STEP), "--perturb-rank", "1", "--perturb-step", str(PERTURB_STEP)]
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_for_run(stack, token: str, key: str, job: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if requests.get(f"{stack.url}/api/v1/runs/{key}", headers={"Authorization": f"Bearer {token}"}).ok:
            return
        assert job.poll() is None, job.stdout.read().decode(errors="replace")
        time.sleep(0.2)
    raise AssertionError("run never appeared")


def test_divergences_reach_websocket_and_run_page(stack, tmp_path):
    project = Project.objects.create(name="e2e")
    token = ProjectToken.issue(project)
    user = User.objects.create_user("alice", password="wonderland")
    project.members.add(user)
    browser_client = Client()
    browser_client.force_login(user)
    session = browser_client.cookies["sessionid"].value
    headers = {"Cookie": f"sessionid={session}", "Origin": stack.url}
    feed = Feed(stack.url.replace("http", "ws") + "/ws/alerts/", headers)
    feed.start()

    run_key = f"e2e-{uuid.uuid4().hex[:8]}"
    job = launch_job(stack, token, run_key, tmp_path / "spool")
    try:
        wait_for_run(stack, token, run_key, job)
        with chromium_page(stack.url, session) as page:
            page.goto(f"{stack.url}/runs/{run_key}/")
            page.wait_for_selector("#live-status:text('live')", timeout=15_000)
            assert page.locator("li.alert[data-kind=grad_divergence]").count() == 0  # not there at load time
            page.wait_for_selector("li.alert[data-kind=grad_divergence]", timeout=120_000)
            page.wait_for_selector("li.alert[data-kind=recompile_divergence]", timeout=60_000)
            shown = page.locator("li.alert[data-kind=grad_divergence]").inner_text()
            assert "ranks 1" in shown and f"step {PERTURB_STEP}" in shown
            recompile = page.locator("li.alert[data-kind=recompile_divergence]").inner_text()
            assert "ranks 1" in recompile and "size mismatch" in recompile
            assert page.evaluate("performance.getEntriesByType('navigation').length") == 1  # no reload

        output, _ = job.communicate(timeout=120)
        assert job.returncode == 0, output.decode(errors="replace")
        alerts = feed.wait_for({"grad_divergence", "recompile_divergence"}, timeout=30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, 9)
            job.wait()
        feed.ws.close()

    grad, recompile = alerts["grad_divergence"], alerts["recompile_divergence"]
    assert (grad["ranks"], grad["step"], grad["severity"], grad["run"]) == ([1], PERTURB_STEP, "critical", run_key)
    assert grad["details"]["tie"] is False and grad["details"]["buckets"]
    assert (recompile["ranks"], recompile["step"]) == ([1], SHAPE_STEP)
    assert "size mismatch" in recompile["message"] and recompile["frame"]
    kinds = sorted(a["kind"] for a in feed.alerts)
    assert kinds == ["grad_divergence", "recompile_divergence"], kinds  # nothing false, nothing twice

    api = requests.get(f"{stack.url}/api/v1/runs/{run_key}", headers={"Authorization": f"Bearer {token}"}).json()
    assert [r["rank"] for r in api["ranks"]] == [0, 1, 2]
    assert {r["status"] for r in api["ranks"]} == {"ok"}
    assert api["status"] == "finished" and api["last_step"] == STEPS - 1
