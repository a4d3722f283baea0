"""The command lines of the project's own processes, and stopping child processes (servers, workers,
torchrun jobs) the same way everywhere: `manage.py up`, the tests and the benchmarks share both."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from agents import procstat


def server_command(host: str, port: int, *options: str) -> list[str]:
    """The ASGI server (`dashboard.serve`: uvicorn, each worker on a socket of its own); `options`:
    more of its own (--workers N, --no-access-log)."""
    return [
        sys.executable,
        "-m",
        "dashboard.serve",
        "--host",
        host,
        "--port",
        str(port),
        "--log-level",
        "warning",
        *options,
    ]


def worker_command(*options: str, loglevel: str = "warning", concurrency: int = 1) -> list[str]:
    """A Celery worker with its beat (the periodic sweeps; a beat that dies is restarted by the worker,
    `dashboard.beat_schedule.BeatKeeper`), `concurrency` tasks at a time; `options`: more of Celery's
    (--schedule FILE)."""
    worker = ["-m", "celery", "-A", "dashboard", "worker", "-B", "--concurrency", str(concurrency)]
    return [sys.executable, *worker, "--loglevel", loglevel, *options]


def stop_groups(procs: list[subprocess.Popen[Any]], grace: float = 15) -> None:
    """SIGTERM every still-running process group, give them `grace` seconds, then kill what is left
    (`kill_tree`), including members of a group whose leader went first (a Celery worker's beat or
    pool child outliving its main process). The processes must have been started with
    `start_new_session=True`."""
    groups = [proc.pid for proc in procs if proc.poll() is None]
    for pgid in groups:
        _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_tree(proc)
    for pgid in groups:
        if survivors(group_members(pgid), timeout=max(0.0, deadline - time.monotonic())):
            _signal_group(pgid, signal.SIGKILL)


def kill_tree(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL a process, its group and every process below it, then reap it. torchrun starts each
    worker in a session of its own, so killing torchrun's group alone leaves the ranks running
    (a frozen rank and the ranks waiting for it in a collective would live on)."""
    below = descendants(proc.pid)
    _signal_group(proc.pid, signal.SIGKILL)
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`: children, their children, and so on."""
    children: dict[int, list[int]] = {}
    for child, fields in procstat.every():
        children.setdefault(int(fields[1]), []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def group_members(pgid: int) -> list[int]:
    """Every live process of the process group `pgid`, its leader gone or not."""
    return [pid for pid, fields in procstat.every() if int(fields[procstat.PGRP]) == pgid and fields[0] != "Z"]


def alive(pid: int) -> bool:
    """Running or stopped; a zombie (dead, waiting to be reaped) does not count."""
    return procstat.state(pid) not in (None, "Z")


def survivors(pids: list[int], timeout: float = 5) -> list[int]:
    """The pids still alive after waiting up to `timeout` seconds for them to go."""
    deadline = time.monotonic() + timeout
    while (left := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:  # it ended between the check and the signal
        pass
