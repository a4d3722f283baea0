"""Where the ASGI worker processes of one server keep their Prometheus counters, so /metrics sums them.

`python -m dashboard.serve --workers N` (as `uvicorn --workers N`) starts N processes
(multiprocessing, spawn) under one supervisor. Each counts
its own requests; without a shared folder (PROMETHEUS_MULTIPROC_DIR) a scrape reads whichever worker
answered and counters jump between workers' values, which Prometheus takes for resets. Unless the
operator set that variable, every worker of one supervisor uses `DATA_DIR/prometheus/<supervisor>`,
named by the supervisor's pid and start time: a fresh start of the server is a fresh folder, a worker
the supervisor restarts keeps its predecessors' counts (prometheus_client keeps a dead process's
counter files, as `mark_process_dead` does), and folders of supervisors that are gone are removed by
the next server's workers. A lone process (no supervisor) keeps counting in memory, as before.
"""

from __future__ import annotations

import multiprocessing
import shutil
from pathlib import Path

from agents import procstat

PREFIX = "server-"


def supervisor() -> int | None:
    """The pid of the process that spawned this one as a worker (the server's supervisor), or None."""
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None else None


def folder_name(pid: int) -> str:
    return f"{PREFIX}{pid}-{procstat.start_time(pid)}"


def alive(name: str) -> bool:
    """Whether the supervisor a folder is named after still runs (the same process, not a reused pid)."""
    pid = name[len(PREFIX) :].split("-", 1)[0]
    return pid.isdigit() and folder_name(int(pid)) == name


def workers_folder(data_dir: Path) -> str:
    """This worker's shared counter folder ('' for a lone process), created, with the folders of
    supervisors that are gone removed (settings exports it as PROMETHEUS_MULTIPROC_DIR for
    prometheus_client, which reads it when first imported)."""
    pid = supervisor()
    if pid is None:
        return ""
    root = data_dir / "prometheus"
    mine = root / folder_name(pid)
    mine.mkdir(parents=True, exist_ok=True)
    for old in root.iterdir():
        if old.name.startswith(PREFIX) and old != mine and not alive(old.name):
            shutil.rmtree(old, ignore_errors=True)
    return str(mine)
