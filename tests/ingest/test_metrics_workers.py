"""The server's two workers as the docs start them (`python -m dashboard.serve --workers 2`, each on a
socket of its own), PROMETHEUS_MULTIPROC_DIR unset: /metrics sums both workers on every scrape (a
counter never jumps back), and a fresh start of the server starts from zero; a worker that dies is
replaced, a second server cannot share the port, and a stop ends every worker."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from dashboard.devstack.processes import group_members, survivors
from dashboard.tenancy.models import Project, ProjectToken
from tests.conftest import make_batch
from tests.stack import ROOT, Stack, free_port, spawn, unique, uvicorn

ACCEPTED = 'lockstep_ingest_requests_total{endpoint="ingest",outcome="accepted",status="200"}'


def _server(env: dict, logdir) -> Stack:
    port = free_port()
    proc = spawn(
        f"uvicorn-{port}",
        uvicorn(port, "--workers", "2"),
        env,
        logdir,
    )
    server = Stack(f"http://127.0.0.1:{port}", env, proc, proc)
    server.wait_http(90)
    return server


def _post(url: str, token: str, body: dict) -> int:
    return requests.post(
        url + "/api/v1/ingest",
        data=gzip.compress(json.dumps(body).encode()),
        timeout=60,
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Content-Encoding": "gzip",
            "Connection": "close",
        },
    ).status_code


def _accepted(url: str) -> float:
    text = requests.get(url + "/metrics", timeout=60).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(ACCEPTED + " "))


def test_two_workers_count_together_and_a_fresh_start_counts_from_zero(stack_env, live_db, tmp_path):
    token = ProjectToken.issue(Project.objects.create(name=unique("metrics-workers")))
    env = {k: v for k, v in stack_env.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update(LOCKSTEP_DATA_DIR=str(tmp_path / "data"), LOCKSTEP_METRICS_PUBLIC="1", LOCKSTEP_RATE_LIMIT="0")
    run = unique("mw")
    batches = [
        make_batch(run=run, rank=r, world_size=4, seq=s, session=f"s-{run}-{r}") for r in range(4) for s in range(6)
    ]
    server = _server(env, tmp_path)
    try:
        with ThreadPoolExecutor(6) as pool:  # at once, on fresh connections: both workers take some
            assert list(pool.map(lambda b: _post(server.url, token, b), batches)) == [200] * len(batches)
        scrapes = [_accepted(server.url) for _ in range(8)]
        folders = list((tmp_path / "data" / "prometheus").iterdir())
        assert len(folders) == 1
        workers = {p.name.rsplit("_", 1)[1] for p in folders[0].glob("counter_*.db")}
    finally:
        server.server.stop()
    assert scrapes == [len(batches)] * 8, scrapes
    assert len(workers) == 2, workers  # both workers counted into the one folder

    again = _server(env, tmp_path)  # a fresh start: the stopped server's counts are gone, not summed in
    try:
        assert _post(again.url, token, make_batch(run=unique("mw"), rank=0, world_size=1)) == 200
        assert [_accepted(again.url) for _ in range(4)] == [1.0] * 4
        assert [p.name for p in (tmp_path / "data" / "prometheus").iterdir()] != [folders[0].name]
    finally:
        again.server.stop()


def _workers(server: Stack) -> set[int]:
    """The pids of the server's worker processes (its supervisor's spawned children)."""
    supervisor = server.server.popen.pid
    found = set()
    for pid in group_members(supervisor):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if pid != supervisor and b"spawn_main" in cmdline:
            found.add(pid)
    return found


def _until(condition, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_a_worker_that_dies_is_replaced_and_no_second_server_shares_the_port(stack_env, live_db, tmp_path):
    token = ProjectToken.issue(Project.objects.create(name=unique("serve")))
    env = {**stack_env, "LOCKSTEP_RATE_LIMIT": "0"}
    server = _server(env, tmp_path)
    try:
        _until(lambda: len(_workers(server)) == 2)
        first = _workers(server)
        os.kill(min(first), signal.SIGKILL)
        _until(lambda: len(_workers(server)) == 2 and _workers(server) != first)
        run = unique("serve")
        batches = [make_batch(run=run, rank=r, world_size=8, session=f"s-{run}-{r}") for r in range(8)]
        with ThreadPoolExecutor(4) as pool:  # fresh connections, spread over both workers, the new one among them
            assert list(pool.map(lambda b: _post(server.url, token, b), batches)) == [200] * 8

        port = int(server.url.rsplit(":", 1)[1])
        second = subprocess.run(uvicorn(port), cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2 and "in use" in second.stderr
        assert _post(server.url, token, make_batch(run=run, rank=0, world_size=8, seq=1, session=f"s-{run}-0")) == 200

        workers = _workers(server)
        os.kill(server.server.popen.pid, signal.SIGTERM)  # the supervisor alone: it stops its workers
        assert server.server.popen.wait(30) == 0
        assert survivors(sorted(workers), timeout=10) == []
    finally:
        server.server.stop()


def test_workers_that_cannot_start_stop_the_server_with_an_error(stack_env, tmp_path):
    """An application that does not load fails each worker as it starts: the server exits 1, saying
    so, instead of restarting them forever."""
    env = {**stack_env, "DJANGO_SETTINGS_MODULE": "dashboard.no_such_settings"}
    started = time.monotonic()
    failed = subprocess.run(
        uvicorn(free_port(), "--workers", "2"), cwd=ROOT, env=env, capture_output=True, text=True, timeout=90
    )
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert "as it started: stopping" in failed.stderr and time.monotonic() - started < 60
