"""Stopping child process groups (servers, workers, demo jobs) the same way everywhere."""
from __future__ import annotations

import os
import signal
import subprocess


def stop_groups(procs: list[subprocess.Popen], grace: float = 15) -> None:
    """SIGTERM every still-running process group, give each `grace` seconds, then SIGKILL the group
    of any that is left. The processes must have been started with `start_new_session=True`."""
    for proc in procs:
        if proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:  # it ended between the check and the signal
        pass
