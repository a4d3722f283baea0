"""Find your run (issue 52, item 5): without LOCKSTEP_RUN the key is generated, and rank 0's agent
names it and its page once, in one line on stderr, at attach; the other ranks say nothing."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.stack import ROOT

ATTACH = "import agents; a = agents.attach(); print(a.cfg.run); a.close(timeout=1)"


def said(stderr: str) -> list[str]:
    """The agent's lines (torch may warn in a bare interpreter: no numpy; tests/agents/test_quiet.py
    compares a whole job's stderr with and without the agent)."""
    return [line for line in stderr.splitlines() if line.startswith("lockstep")]


def attach(tmp_path, rank: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCKSTEP_", "TORCHELASTIC_"))}
    env.update(
        LOCKSTEP_OFFLINE="1",
        LOCKSTEP_SPOOL_DIR=str(tmp_path / f"spool-{rank}"),
        LOCKSTEP_PAGE_URL="http://lockstep.example:8000/",
        LOCKSTEP_PROGRESS_EVERY="0",
        RANK=str(rank),
        WORLD_SIZE="2",
    )
    return subprocess.Popen(
        [sys.executable, "-c", ATTACH], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_rank_0_names_its_generated_run_and_page_once_on_stderr_and_rank_1_says_nothing(tmp_path):
    ranks = [attach(tmp_path, rank) for rank in (0, 1)]
    (out0, err0), (_, err1) = (rank.communicate(timeout=120) for rank in ranks)
    assert [rank.returncode for rank in ranks] == [0, 0], err0 + err1
    key = out0.strip().splitlines()[-1]
    assert key.startswith("job-")
    assert said(err0) == [f"lockstep: run {key} http://lockstep.example:8000/runs/{key}/"]
    assert said(err1) == []


def test_offline_without_a_server_the_line_says_where_the_spool_is(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env.update(LOCKSTEP_OFFLINE="1", LOCKSTEP_SPOOL_DIR=str(tmp_path), LOCKSTEP_RUN="r-1", LOCKSTEP_PROGRESS_EVERY="0")
    done = subprocess.run(
        [sys.executable, "-c", ATTACH], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert said(done.stderr) == [f"lockstep: run r-1 (offline: spooled in {tmp_path})"]
