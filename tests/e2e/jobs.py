"""Launch real torchrun jobs with the agent against the test stack, and watch alerts arrive."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from contextlib import contextmanager

import requests
from django.contrib.auth.models import User
from django.test import Client
from websockets.sync.client import connect

from agents.launch import torchrun as torchrun_command
from dashboard.devstack.processes import descendants, kill_tree
from dashboard.tenancy.models import DEFAULT_SCOPES, Project, ProjectToken
from tests.stack import ROOT, free_port, unique

WRAPPER = ROOT / "demo" / "per_rank_env.py"  # runs a script under per-rank environment settings (PER_RANK_ENV)


def torchrun(
    stack,
    token: str,
    run_key: str,
    script: str,
    args: list[str],
    spool,
    ranks: int = 3,
    extra_env: dict | None = None,
    via_agent_cli: bool = True,
) -> subprocess.Popen:
    """torchrun SCRIPT under the agent (`-m agents run`), or as is when the script attaches it itself.

    Inductor compiles in-process (TORCHINDUCTOR_COMPILE_THREADS=1): three ranks with a pool of
    compile workers each oversubscribe two cores, and rare hangs of these jobs were seen in CI."""
    env = dict(
        stack.env,
        LOCKSTEP_URL=stack.url,
        LOCKSTEP_TOKEN=token,
        LOCKSTEP_RUN=run_key,
        LOCKSTEP_SPOOL_DIR=str(spool),
        LOCKSTEP_HEARTBEAT="1",
        OMP_NUM_THREADS="1",
        PYTHONFAULTHANDLER="1",
        TORCHINDUCTOR_COMPILE_THREADS="1",
        **(extra_env or {}),
    )
    cmd = torchrun_command(ranks, script, *args, port=free_port(), agent=via_agent_cli)
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )


@contextmanager
def running(job: subprocess.Popen):
    """Yield the job; kill it and every rank below it on the way out, whatever happened."""
    try:
        yield job
    finally:
        if job.poll() is None:
            kill_tree(job)
        job.wait()


def finish(job: subprocess.Popen, timeout: float = 180) -> str:
    try:
        output, _ = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"job still running after {timeout} s; the ranks' stacks:\n{_stacks(job)[-12000:]}"
        ) from None
    text = output.decode(errors="replace")
    assert job.returncode == 0, text
    return text


def _stacks(job: subprocess.Popen) -> str:
    """SIGABRT every rank: with PYTHONFAULTHANDLER each prints all its threads' Python stacks,
    which is what a hang needs to be understood; then whatever is left is killed."""
    for pid in descendants(job.pid):
        try:
            os.kill(pid, signal.SIGABRT)
        except ProcessLookupError:
            pass
    try:
        output, _ = job.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        kill_tree(job)
        output, _ = job.communicate()
    return output.decode(errors="replace")


class Feed(threading.Thread):
    """Collects every alert message from a websocket until closed."""

    def __init__(self, url: str, headers: dict) -> None:
        super().__init__(daemon=True)
        self.ws = connect(url, additional_headers=headers, open_timeout=10)
        self.alerts: list[dict] = []
        self.progress: list[dict] = []
        self.closed_by: Exception | None = None

    def run(self) -> None:
        try:
            for raw in self.ws:
                message = json.loads(raw)
                if message["type"] == "alert":
                    self.alerts.append(message["alert"])
                elif message["type"] == "progress":
                    self.progress.append(message)
        except Exception as exc:  # reported by wait_for
            self.closed_by = exc

    def latest(self, run: str | None = None) -> dict[str, dict]:
        """Latest state of each alert kind (messages are revisions; later ones win)."""
        return {a["kind"]: a for a in self.alerts if run is None or a["run"] == run}

    def wait_for(self, kinds: set[str], timeout: float, run: str | None = None) -> dict[str, dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.latest(run)
            if kinds <= set(found):
                return found
            time.sleep(0.2)
        raise AssertionError(f"alerts {kinds} not all received; got {self.alerts}; socket closed by {self.closed_by!r}")


def member_session(project: Project, username: str) -> str:
    user = User.objects.create_user(unique(username), password="pw-" + username)
    project.members.add(user)
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def project_with_token(name: str, scopes: tuple[str, ...] = DEFAULT_SCOPES) -> tuple[Project, str]:
    project = Project.objects.create(name=unique(name))
    return project, ProjectToken.issue(project, scopes)


def alert_feed(stack, session: str, path: str = "/ws/alerts/") -> Feed:
    feed = Feed(stack.url.replace("http", "ws") + path, {"Cookie": f"sessionid={session}", "Origin": stack.url})
    feed.start()
    return feed


def api(stack, token: str, path: str) -> requests.Response:
    return requests.get(f"{stack.url}/api/v1{path}", headers={"Authorization": f"Bearer {token}"}, timeout=10)


def wait_for_run(stack, token: str, key: str, job: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if api(stack, token, f"/runs/{key}").ok:
            return
        assert job.poll() is None, job.stdout.read().decode(errors="replace")
        time.sleep(0.2)
    raise AssertionError("run never appeared")
