"""Ranks that share one Inductor cache directory while one of them runs another CPU ISA, on real
2-rank gloo torchrun jobs (demo/scenarios.py --elementwise-check) through the real stack.

With ATEN_CPU_CAPABILITY=avx2 on rank 1 and AVX512 (this machine's default) on rank 0, the FX-graph
and AOTAutograd cache keys are the same while the C++ code Inductor writes is not (vector width 8
vs 16). Cold, both ranks compile their own code under that key: whichever writes last poisons the
entry (warning). Warm from an AVX512 run, rank 1 loads AVX512 code and computes garbage: every
step the job checks a compiled `sin(x) * y + 1` on 1000 floats against eager and prints how many
elements differ (critical). Private cache dirs per rank are the control: nothing is shared.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid

import pytest

from tests.e2e.jobs import api, finish, running, torchrun
from tests.e2e.test_scenarios import WRAPPER, team  # noqa: F401  (the fixture)
from tests.stack import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]

JOB = ["demo/scenarios.py", "--steps", "2", "--elementwise-check"]
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2"}
MISMATCH = re.compile(r"rank (\d): compiled != eager in (\d+) of 1000 elements")


def isa_job(stack, token: str, key: str, tmp_path, per_rank: dict, cache_dir=None) -> str:
    """The 2-rank job under per-rank settings; returns its output (all ranks)."""
    env = {"PER_RANK_ENV": json.dumps(per_rank)}
    if cache_dir is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    with running(torchrun(stack, token, key, str(WRAPPER), JOB, tmp_path / f"spool-{key}", ranks=2, extra_env=env,
                          via_agent_cli=False)) as job:
        return finish(job)


def artifacts(stack, token: str, key: str) -> dict[str, dict]:
    """The run's stored rank_specific_artifact alerts by frame (one alert per frame)."""
    rows = api(stack, token, f"/runs/{key}/alerts").json()["alerts"]
    return {a["frame"]: a for a in rows if a["kind"] == "rank_specific_artifact"}


def elementwise_alert(stack, token: str, key: str, severity: str, timeout: float = 30) -> tuple[dict, dict]:
    """Wait until the helper's frame has an alert of `severity`; returns it and all the run's."""
    deadline = time.monotonic() + timeout
    while True:
        found = artifacts(stack, token, key)
        helper = [a for frame, a in found.items() if frame.endswith(":elementwise")]
        if helper and helper[0]["severity"] == severity:
            return helper[0], found
        assert time.monotonic() < deadline, found
        time.sleep(0.5)


def fill_cache(stack, directory) -> None:
    """One AVX512 rank runs the same job into an empty cache directory (no agent, like the cold-cache test)."""
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", *JOB[:1], "--steps", "1",
                    "--elementwise-check"], cwd=ROOT, check=True, capture_output=True, timeout=300,
                   env={**stack.env, "TORCHINDUCTOR_CACHE_DIR": str(directory), "OMP_NUM_THREADS": "1",
                        "TORCHINDUCTOR_COMPILE_THREADS": "1"})


def test_cold_shared_cache_with_another_isa_on_rank_1_warns(stack, team, tmp_path):
    """Both ranks miss and compile different code under one key in one directory: a warning naming
    rank 1 (no strict majority of 2: rank 0 is the reference), with both ISAs in the details."""
    token, feed = team
    key = f"isa-cold-{uuid.uuid4().hex[:6]}"
    output = isa_job(stack, token, key, tmp_path, {"1": AVX2}, cache_dir=tmp_path / "shared-cache")
    feed.wait_for({"rank_specific_artifact"}, 60, run=key)
    helper, found = elementwise_alert(stack, token, key, "warning")
    assert helper["ranks"] == [1]
    assert helper["details"]["codegen"] == {"0": {"cpu_capability": "AVX512"}, "1": {"cpu_capability": "AVX2"}}
    assert helper["details"]["cache"] == {"0": "miss", "1": "miss"}
    assert helper["details"]["shared_dir"] == str(tmp_path / "shared-cache")
    assert all(a["ranks"] == [1] for a in found.values()), found  # the model's frame too: its kernels are C++ as well
    assert not MISMATCH.search(output), output  # each rank ran the code it compiled itself


def test_warm_shared_cache_loaded_by_an_avx2_rank_is_critical_and_computes_garbage(stack, team, tmp_path):
    """The cache is filled by an AVX512 run; then rank 1 (AVX2) loads that code: critical, and the job
    itself shows rank 1's compiled helper disagreeing with eager. The control, same ISAs with a cache
    dir per rank, computes right and raises no rank_specific_artifact."""
    token, feed = team
    warm = tmp_path / "warm-cache"
    fill_cache(stack, warm)

    key = f"isa-warm-{uuid.uuid4().hex[:6]}"
    output = isa_job(stack, token, key, tmp_path, {"1": AVX2}, cache_dir=warm)
    wrong = {(int(rank), int(n)) for rank, n in MISMATCH.findall(output)}
    assert {rank for rank, _ in wrong} == {1}, output  # rank 1 only, and it does
    assert all(0 < n < 1000 for _, n in wrong), wrong
    assert "rank 1: elementwise check (AVX2, 2 steps): compiled != eager at steps [0, 1]" in output
    assert "rank 0: elementwise check (AVX512, 2 steps): compiled == eager at every step" in output
    feed.wait_for({"rank_specific_artifact"}, 60, run=key)
    helper, found = elementwise_alert(stack, token, key, "critical")
    assert helper["ranks"] == [1] and helper["details"]["loaded"] == [0, 1]
    assert helper["details"]["codegen"] == {"0": {"cpu_capability": "AVX512"}, "1": {"cpu_capability": "AVX2"}}
    assert "cpu_capability=AVX2" in helper["message"]
    assert all(a["ranks"] == [1] and a["severity"] == "critical" for a in found.values()), found

    control = f"isa-ctl-{uuid.uuid4().hex[:6]}"
    private = {"0": {"TORCHINDUCTOR_CACHE_DIR": str(warm)},
               "1": {**AVX2, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "rank1-cache")}}
    output = isa_job(stack, token, control, tmp_path, private)
    assert not MISMATCH.search(output), output
    assert "rank 1: elementwise check (AVX2, 2 steps): compiled == eager at every step" in output
    # Rank 0 loads from its warm dir, rank 1 compiles into its cold one: that settled slot is this alert.
    cache = feed.wait_for({"cache_divergence"}, 60, run=control)["cache_divergence"]
    assert cache["ranks"] == [1]
    time.sleep(1)
    assert "rank_specific_artifact" not in feed.latest(control)
    assert artifacts(stack, token, control) == {}
