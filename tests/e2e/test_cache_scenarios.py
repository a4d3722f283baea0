"""Cache scenarios on real 3-rank gloo torchrun jobs through the real stack: one rank with a cold
Inductor cache, and ranks sharing one cache directory with one rank's own settings."""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import pytest

from agents.launch import torchrun as torchrun_command
from tests.e2e.jobs import WRAPPER, api, finish, running, torchrun
from tests.stack import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]


def test_cold_cache_on_one_rank(stack, team, tmp_path):
    token, feed = team
    warm = stack.env["TORCHINDUCTOR_CACHE_DIR"]  # the suite's: warm already when another test ran this job
    cold = tmp_path / "cold-cache"
    # Make sure it holds this job's entries (one rank, one step), then give it to ranks 0 and 2.
    subprocess.run(
        torchrun_command(1, "demo/ddp_job.py", "--steps", "1", agent=False),
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
        env=stack.env,  # one OpenMP thread, in-process compiles (tests/conftest.py), as the job's
    )
    key = f"sc-cache-{uuid.uuid4().hex[:6]}"
    per_rank = {
        "0": {"TORCHINDUCTOR_CACHE_DIR": warm},
        "1": {"TORCHINDUCTOR_CACHE_DIR": str(cold)},
        "2": {"TORCHINDUCTOR_CACHE_DIR": warm},
    }
    with running(
        torchrun(
            stack,
            token,
            key,
            str(WRAPPER),
            ["demo/ddp_job.py", "--steps", "4"],
            tmp_path / "spool",
            extra_env={"PER_RANK_ENV": json.dumps(per_rank)},
            via_agent_cli=False,
        )
    ) as job:
        finish(job)
    alerts = feed.wait_for({"cache_divergence"}, 60, run=key)
    assert alerts["cache_divergence"]["ranks"] == [1]
    assert alerts["cache_divergence"]["details"]["miss"] == [1]
    time.sleep(0.5)
    assert "grad_divergence" not in feed.latest(key)
    assert "rank_specific_artifact" not in feed.latest(key)  # private cache dirs: nothing shared


def test_shared_cache_with_rank_specific_settings_and_another_collective_schedule(stack, team, tmp_path):
    """Ranks share one Inductor cache directory but rank 1 runs with other Inductor settings
    (TORCHINDUCTOR_SIZE_ASSERTS=0), so its FX-graph cache keys are its own: it never looks up the
    others' entries, nothing rank-specific is shared, no rank_specific_artifact. Rank 2 folds an
    extra all_reduce into a compiled graph (collective_schedule_divergence)."""
    token, feed = team
    key = f"sc-shared-{uuid.uuid4().hex[:6]}"
    env = {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "shared-cache"),
        "PER_RANK_ENV": json.dumps({"1": {"TORCHINDUCTOR_SIZE_ASSERTS": "0"}}),
    }
    args = ["demo/scenarios.py", "--steps", "4", "--collective-rank", "2"]
    with running(
        torchrun(stack, token, key, str(WRAPPER), args, tmp_path / "spool", extra_env=env, via_agent_cli=False)
    ) as job:
        finish(job)
    alerts = feed.wait_for({"collective_schedule_divergence"}, 60, run=key)
    schedule = alerts["collective_schedule_divergence"]
    assert schedule["ranks"] == [2] and "pulse" in schedule["frame"]
    time.sleep(1)  # the model's slots settle with the same batches as pulse's
    assert "rank_specific_artifact" not in feed.latest(key)
    stored = {a["kind"] for a in api(stack, token, f"/runs/{key}/alerts").json()["alerts"]}
    assert "rank_specific_artifact" not in stored
    assert "grad_divergence" not in feed.latest(key)
