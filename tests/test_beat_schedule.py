"""Celery beat's schedule file goes to the data folder (or LOCKSTEP_BEAT_SCHEDULE), never into the
folder the worker was started from: a real `celery -A dashboard worker -B` in an empty folder."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dashboard.devstack.processes import stop_groups
from tests.stack import ROOT

pytestmark = pytest.mark.e2e  # a real Celery worker, like tests/e2e/


def _worker_with_beat(cwd: Path, env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "dashboard", "worker", "-B", "--concurrency", "1",
                             "--loglevel", "info"], cwd=cwd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _until_beat_sent_a_task(worker: subprocess.Popen, log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while "Sending due task" not in log.read_text(errors="replace"):
        assert worker.poll() is None, log.read_text(errors="replace")
        assert time.monotonic() < deadline, log.read_text(errors="replace")
        time.sleep(0.3)


@pytest.mark.parametrize("configured", [False, True], ids=["data-folder", "LOCKSTEP_BEAT_SCHEDULE"])
def test_beat_schedule_file_stays_out_of_the_working_directory(stack_env, tmp_path, configured):
    cwd, data, elsewhere = tmp_path / "cwd", tmp_path / "data", tmp_path / "beat" / "state"
    cwd.mkdir()
    env = {**stack_env, "LOCKSTEP_DATA_DIR": str(data), "PYTHONPATH": str(ROOT)}
    env.pop("LOCKSTEP_BEAT_SCHEDULE", None)
    if configured:
        env["LOCKSTEP_BEAT_SCHEDULE"] = str(elsewhere / "schedule")
    log = tmp_path / "worker.log"
    worker = _worker_with_beat(cwd, env, log)
    try:
        _until_beat_sent_a_task(worker, log)
    finally:
        stop_groups([worker], grace=10)
    expected_dir, stem = (elsewhere, "schedule") if configured else (data, "celerybeat-schedule")
    assert sorted(os.listdir(cwd)) == []
    assert [p.name for p in expected_dir.iterdir() if p.name.startswith(stem)], log.read_text(errors="replace")
    if configured:
        assert not [p for p in data.iterdir() if p.name.startswith("celerybeat-schedule")]
