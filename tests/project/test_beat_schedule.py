"""Celery beat's schedule file goes to the data folder (or LOCKSTEP_BEAT_SCHEDULE), never into the
folder the worker was started from: a real `celery -A dashboard worker -B` in an empty folder.

Both configurations' workers start together, once per module (`workers`), so their start-ups overlap;
each test then waits for its own worker's beat, stops that worker and checks its folders."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from dashboard.devstack.processes import stop_groups
from tests.stack import ROOT

pytestmark = pytest.mark.e2e  # a real Celery worker, like tests/e2e/

CONFIGURED = {"data-folder": False, "LOCKSTEP_BEAT_SCHEDULE": True}


def _worker_with_beat(cwd: Path, env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "dashboard", "worker", "-B", "--concurrency", "1", "--loglevel", "info"],
        cwd=cwd,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _until_beat_opened_its_schedule(worker: subprocess.Popen, base: Path, log: Path, timeout: float = 90) -> None:
    """Until a file other than the log appears under `base`, wherever it went. Not until beat sends a
    task: the workers share one Redis, and in each period only the first beat to claim a sweep sends it."""
    deadline = time.monotonic() + timeout
    while not [p for p in base.rglob("*") if p.is_file() and p != log]:
        assert worker.poll() is None, log.read_text(errors="replace")
        assert time.monotonic() < deadline, log.read_text(errors="replace")
        time.sleep(0.1)


@dataclass
class Started:
    cwd: Path
    data: Path
    elsewhere: Path
    log: Path
    worker: subprocess.Popen


@pytest.fixture(scope="module")
def workers(stack_env, tmp_path_factory):
    """One worker with beat per configuration, each in an empty folder of its own, all started at once."""
    started: dict[str, Started] = {}
    try:
        for name, configured in CONFIGURED.items():
            base = tmp_path_factory.mktemp("beat")
            cwd, data, elsewhere = base / "cwd", base / "data", base / "beat" / "state"
            cwd.mkdir()
            env = {**stack_env, "LOCKSTEP_DATA_DIR": str(data), "PYTHONPATH": str(ROOT)}
            env.pop("LOCKSTEP_BEAT_SCHEDULE", None)
            if configured:
                env["LOCKSTEP_BEAT_SCHEDULE"] = str(elsewhere / "schedule")
            log = base / "worker.log"
            started[name] = Started(cwd, data, elsewhere, log, _worker_with_beat(cwd, env, log))
        yield started
    finally:
        stop_groups([s.worker for s in started.values()], grace=10)


@pytest.mark.parametrize("configured", list(CONFIGURED.values()), ids=list(CONFIGURED))
def test_beat_schedule_file_stays_out_of_the_working_directory(workers, configured):
    [s] = [workers[name] for name, c in CONFIGURED.items() if c == configured]
    try:
        _until_beat_opened_its_schedule(s.worker, s.cwd.parent, s.log)
    finally:
        stop_groups([s.worker], grace=10)
    expected_dir, stem = (s.elsewhere, "schedule") if configured else (s.data, "celerybeat-schedule")
    assert sorted(os.listdir(s.cwd)) == []
    assert [p.name for p in expected_dir.iterdir() if p.name.startswith(stem)], s.log.read_text(errors="replace")
    if configured:
        assert not [p for p in s.data.iterdir() if p.name.startswith("celerybeat-schedule")]
