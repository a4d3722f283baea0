"""Stopping child processes (servers, workers, torchrun jobs) the same way everywhere."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def stop_groups(procs: list[subprocess.Popen], grace: float = 15) -> None:
    """SIGTERM every still-running process group, give each `grace` seconds, then kill what is left
    (`kill_tree`). The processes must have been started with `start_new_session=True`."""
    for proc in procs:
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            kill_tree(proc)


def kill_tree(proc: subprocess.Popen) -> None:
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
    """Every live process below `pid`, from /proc (Linux): children, their children, and so on."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Running or stopped; a zombie (dead, waiting to be reaped) does not count."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


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
