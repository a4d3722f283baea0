"""Start `tests/agents/tiny_ddp_job.py` under torchrun (2 ranks by default, offline spool), several at once."""

from __future__ import annotations

import os
import subprocess

from agents.launch import torchrun
from dashboard.devstack.processes import kill_tree
from tests.stack import ROOT, free_port

JOB = "tests/agents/tiny_ddp_job.py"


def start(spool, run: str, agent: bool = True, ranks: int = 2, **env_extra: str) -> subprocess.Popen:
    """A job of `ranks` ranks; stdout and stderr kept apart (stderr is what a user reads warnings in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env.update(LOCKSTEP_OFFLINE="1", LOCKSTEP_SPOOL_DIR=str(spool), LOCKSTEP_RUN=run, OMP_NUM_THREADS="1", **env_extra)
    cmd = torchrun(ranks, JOB, port=free_port(), agent=agent)
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def finish(job: subprocess.Popen, timeout: float = 240) -> str:
    """The job's stderr once it exited 0 (killed, tree and all, when it overstays)."""
    try:
        _, err = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(job)
        job.communicate()
        raise
    assert job.returncode == 0, err[-4000:]
    return err
