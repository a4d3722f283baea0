"""A cache scenario on a real 3-rank gloo torchrun job through the real stack: the ranks share one
warm Inductor cache directory, as the ranks of a node do by default, while one rank runs with its own
Inductor settings."""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid

import pytest

from agents.launch import torchrun as torchrun_command
from tests.e2e.jobs import WRAPPER, api, finish, running, torchrun
from tests.stack import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]

SCRIPT = "demo/scenarios.py"
JOB = [SCRIPT, "--steps", "4", "--collective-rank", "2"]
MODEL = re.compile(r"scenarios\.py:\d+:main")  # the model's frame: Dynamo names a Sequential by its call site


def test_a_rank_with_its_own_settings_misses_the_shared_cache_alone_and_another_collective_schedule(
    stack, team, tmp_path
):
    """Rank 1 runs with other Inductor settings (TORCHINDUCTOR_SIZE_ASSERTS=0), so its FX-graph cache
    keys are its own: on the directory the others load the model from, it alone misses
    (cache_divergence names it and the variable), and it never loads another rank's code: nothing
    rank-specific is shared, no rank_specific_artifact, and its gradients agree. Rank 2 folds an
    extra all_reduce into a compiled helper (collective_schedule_divergence)."""
    token, feed = team
    shared = stack.env["TORCHINDUCTOR_CACHE_DIR"]  # the suite's, which other tests' jobs warmed already
    # Make sure it holds the model's entries (one rank, one step, the defaults' settings).
    subprocess.run(
        torchrun_command(1, SCRIPT, "--steps", "1", agent=False),
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
        env=stack.env,  # one OpenMP thread, in-process compiles (tests/conftest.py), as the job's
    )
    key = f"sc-shared-{uuid.uuid4().hex[:6]}"
    env = {"TORCHINDUCTOR_CACHE_DIR": shared, "PER_RANK_ENV": json.dumps({"1": {"TORCHINDUCTOR_SIZE_ASSERTS": "0"}})}
    with running(
        torchrun(stack, token, key, str(WRAPPER), JOB, tmp_path / "spool", extra_env=env, via_agent_cli=False)
    ) as job:
        finish(job)
    alerts = feed.wait_for({"collective_schedule_divergence", "cache_divergence"}, 60, run=key)
    schedule = alerts["collective_schedule_divergence"]
    assert schedule["ranks"] == [2] and "pulse" in schedule["frame"]
    time.sleep(1)  # the model's slots settle with the same batches as pulse's
    stored = api(stack, token, f"/runs/{key}/alerts").json()["alerts"]
    [model] = [a for a in stored if a["kind"] == "cache_divergence" and MODEL.fullmatch(a["frame"])]
    assert model["ranks"] == [1] and model["details"]["miss"] == [1] and model["details"]["hit"] == [0, 2], model
    assert model["message"].endswith("(rank 1 runs with `env.TORCHINDUCTOR_SIZE_ASSERTS=0`)"), model
    kinds = {a["kind"] for a in stored} | set(feed.latest(key))
    assert "rank_specific_artifact" not in kinds and "grad_divergence" not in kinds, kinds
