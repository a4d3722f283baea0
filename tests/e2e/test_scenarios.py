"""Every rule the CPU can provoke, on real 3-rank gloo torchrun jobs (demo/scenarios.py) through
the real stack; each job provokes several failures at once to keep the suite short."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest

from tests.e2e.jobs import alert_feed, api, finish, member_session, project_with_token, running, torchrun, wait_for_run
from tests.stack import ROOT

WRAPPER = ROOT / "demo" / "per_rank_env.py"
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]


@pytest.fixture
def team(stack):
    project, token = project_with_token(f"sc-{uuid.uuid4().hex[:6]}")
    feed = alert_feed(stack, member_session(project, f"u-{uuid.uuid4().hex[:6]}"))
    yield token, feed
    feed.ws.close()


def test_branch_nan_storm_and_straggler(stack, team, tmp_path):
    token, feed = team
    key = f"sc-mix-{uuid.uuid4().hex[:6]}"
    args = ["--steps", "10", "--branch-rank", "1", "--nan-rank", "2", "--nan-step", "4", "--storm",
            "--slow-rank", "0", "--slow-seconds", "4"]
    with running(torchrun(stack, token, key, "demo/scenarios.py", args, tmp_path / "spool")) as job:
        finish(job)
    alerts = feed.wait_for({"graph_divergence", "nonfinite_grad", "recompile_storm", "compile_straggler"}, 60, run=key)
    assert alerts["graph_divergence"]["ranks"] == [1]
    assert "branchy" in alerts["graph_divergence"]["frame"]
    assert (alerts["nonfinite_grad"]["ranks"], alerts["nonfinite_grad"]["step"]) == ([2], 4)
    assert "stormy" in alerts["recompile_storm"]["frame"] and alerts["recompile_storm"]["ranks"] == [0, 1, 2]
    assert alerts["compile_straggler"]["ranks"] == [0] and "ramp" in alerts["compile_straggler"]["frame"]
    unexpected = set(feed.latest(key)) - {"graph_divergence", "nonfinite_grad", "grad_divergence", "recompile_storm",
                                          "compile_straggler"}
    assert not unexpected, unexpected


def test_hung_rank_is_silent_and_compiled_ddp_is_ineffective(stack, team, tmp_path):
    """A rank frozen mid-run goes silent while the others (waiting in the all-reduce) keep heartbeating.
    (A rank killed outright makes torchrun stop the whole job, so every rank ends; nothing is silent.)"""
    token, feed = team
    key = f"sc-hang-{uuid.uuid4().hex[:6]}"
    args = ["--steps", "30", "--sleep", "0.2", "--compile-ddp", "--freeze-rank", "2", "--freeze-step", "5"]
    with running(torchrun(stack, token, key, "demo/scenarios.py", args, tmp_path / "spool")) as job:
        wait_for_run(stack, token, key, job)
        alerts = feed.wait_for({"rank_silent", "ineffective_compile"}, 120, run=key)
    assert alerts["rank_silent"]["ranks"] == [2] and alerts["rank_silent"]["state"] == "firing"
    assert "runs mostly eager" in alerts["ineffective_compile"]["message"]
    stored = {a["kind"]: a for a in api(stack, token, f"/runs/{key}/alerts").json()["alerts"]}
    assert "recompile_divergence" not in stored and "graph_divergence" not in stored


def test_cold_cache_on_one_rank(stack, team, tmp_path):
    token, feed = team
    warm = tmp_path / "warm-cache"
    cold = tmp_path / "cold-cache"
    # Fill one cache directory by running the same job on one rank, then give it to ranks 0 and 2.
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "demo/ddp_job.py",
                    "--steps", "1"], cwd=ROOT, check=True, capture_output=True, timeout=300,
                   env={**stack.env, "TORCHINDUCTOR_CACHE_DIR": str(warm)})
    key = f"sc-cache-{uuid.uuid4().hex[:6]}"
    per_rank = {"0": {"TORCHINDUCTOR_CACHE_DIR": str(warm)}, "1": {"TORCHINDUCTOR_CACHE_DIR": str(cold)},
                "2": {"TORCHINDUCTOR_CACHE_DIR": str(warm)}}
    with running(torchrun(stack, token, key, str(WRAPPER), ["demo/ddp_job.py", "--steps", "4"], tmp_path / "spool",
                          extra_env={"PER_RANK_ENV": json.dumps(per_rank)}, via_agent_cli=False)) as job:
        finish(job)
    alerts = feed.wait_for({"cache_divergence"}, 60, run=key)
    assert alerts["cache_divergence"]["ranks"] == [1]
    assert alerts["cache_divergence"]["details"]["miss"] == [1]
    time.sleep(0.5)
    assert "grad_divergence" not in feed.latest(key)
    assert "rank_specific_artifact" not in feed.latest(key)  # private cache dirs: nothing shared


def test_shared_cache_with_rank_specific_settings_and_another_collective_schedule(stack, team, tmp_path):
    """Ranks share one Inductor cache directory but rank 1 runs with other Inductor settings, so its
    cache keys are its own; rank 2 folds an extra all_reduce into a compiled graph."""
    token, feed = team
    key = f"sc-shared-{uuid.uuid4().hex[:6]}"
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "shared-cache"),
           "PER_RANK_ENV": json.dumps({"1": {"TORCHINDUCTOR_SIZE_ASSERTS": "0"}})}
    args = ["demo/scenarios.py", "--steps", "4", "--collective-rank", "2"]
    with running(torchrun(stack, token, key, str(WRAPPER), args, tmp_path / "spool", extra_env=env,
                          via_agent_cli=False)) as job:
        finish(job)
    alerts = feed.wait_for({"rank_specific_artifact", "collective_schedule_divergence"}, 60, run=key)
    artifact = alerts["rank_specific_artifact"]
    assert artifact["ranks"] == [1] and artifact["details"]["shared_cache_dirs"] == [str(tmp_path / "shared-cache")]
    schedule = alerts["collective_schedule_divergence"]
    assert schedule["ranks"] == [2] and "pulse" in schedule["frame"]
    assert "grad_divergence" not in feed.latest(key)
