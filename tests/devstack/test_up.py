"""README command 1's engine, `manage.py up`, on embedded PostgreSQL and Redis in a fresh data
folder: it serves a login, stops everything on Ctrl-C, and reuses its data on the next start."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import requests

from dashboard.devstack import embedded
from dashboard.devstack.processes import descendants, kill_tree, survivors
from tests.stack import ROOT, free_port

pytestmark = pytest.mark.e2e


def start_up(data_dir, port: int, sigint_ignored: bool = False) -> subprocess.Popen:
    """`sigint_ignored`: start it as a shell starts a background job (`up &`), with SIGINT ignored."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")}
    env.update(LOCKSTEP_DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    return subprocess.Popen(
        [sys.executable, "manage.py", "up", "--no-demo", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=ignore,
    )


def wait_line(proc: subprocess.Popen, pattern: str, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if re.search(pattern, line):
            return line
    raise AssertionError(f"no line matching {pattern!r}:\n{''.join(seen)}")


def log_in(url: str) -> requests.Session:
    """The login page is served; the public demo login is refused (--no-demo creates none)."""
    http = requests.Session()
    assert "Log in" in http.get(f"{url}/login/", timeout=10).text
    response = http.post(
        f"{url}/login/",
        timeout=10,
        data={"username": "demo", "password": "lockstep-demo", "csrfmiddlewaretoken": http.cookies["csrftoken"]},
        headers={"Referer": f"{url}/login/"},
        allow_redirects=False,
    )
    assert response.status_code == 200 and "_auth_user_id" not in http.cookies, response.status_code  # the form again
    return http


def stop(proc: subprocess.Popen, data_dir, timeout: float = 120) -> str:
    """Ctrl-C; if it is not done in time, its Python stacks (SIGABRT + faulthandler) and the
    stack's logs go into the failure."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        below = descendants(proc.pid)  # server and worker: in sessions of their own
        os.kill(proc.pid, signal.SIGABRT)
        out, _ = proc.communicate(timeout=30)
        for pid in survivors(below, timeout=0):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        logs = "".join(
            f"\n--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for log in sorted(data_dir.glob("*.log"))
        )
        raise AssertionError(f"`manage.py up` still running {timeout:.0f} s after Ctrl-C:\n{out}{logs}") from None
    return out


def test_up_serves_stops_cleanly_and_reuses_its_data(tmp_path):
    data, port = tmp_path / "data", free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_up(data, port)
    try:
        wait_line(proc, r"^\[lockstep \d\d:\d\d:\d\d\] Lockstep is up: .* no demo login \(--no-demo")
        token = wait_line(proc, r"ingest token").rsplit(" ", 1)[1].strip()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                http = log_in(url)
                break
            except (requests.ConnectionError, KeyError):
                time.sleep(0.5)
        assert "/login/" in http.get(f"{url}/", timeout=10).url  # pages need a login
        assert requests.get(f"{url}/api/v1/runs", headers={"Authorization": f"Bearer {token}"}, timeout=10).json() == {
            "runs": []
        }
        assert "embedded PostgreSQL and Redis stopped" in stop(proc, data)
        assert proc.returncode == 0
        assert embedded.running(data) == []

        proc = start_up(data, port, sigint_ignored=True)  # same folder: the token still works
        wait_line(proc, r"Lockstep is up")
        log_in(url)  # the URL works the moment it is printed
        assert (
            requests.get(f"{url}/api/v1/runs", headers={"Authorization": f"Bearer {token}"}, timeout=10).status_code
            == 200
        )
        assert "embedded PostgreSQL and Redis stopped" in stop(proc, data)  # Ctrl-C works even so
    finally:
        if proc.poll() is None:
            kill_tree(proc)  # its server and worker run in sessions of their own
        if embedded.running(data):
            embedded.stop(data)


def test_the_cli_shim_runs_lockstep_from_any_folder(tmp_path):
    """scripts/bootstrap.sh puts `lockstep` into the virtualenv's bin/ (scripts/cli-shim.sh)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    subprocess.run(["bash", str(ROOT / "scripts" / "cli-shim.sh"), str(venv)], check=True, timeout=30)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(venv / "bin" / "lockstep"), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "usage: lockstep" in done.stdout, done.stderr
