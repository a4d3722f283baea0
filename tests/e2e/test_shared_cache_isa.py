"""Ranks that share one Inductor cache directory while one of them runs another CPU ISA, on real
2-rank gloo torchrun jobs (demo/scenarios.py --elementwise-check, the model eager: the helper is the
jobs' one compiled kernel, so the cold caches these tests need cost one small C++ compile a rank)
through the real stack.

With a lower ATEN_CPU_CAPABILITY on rank 1 than the host's own on rank 0 (AVX2 under AVX512, or
scalar DEFAULT under AVX2), the FX-graph and AOTAutograd cache keys are the same while the C++ code
Inductor writes is not. Cold, both ranks compile their own code under that key: whichever writes
last poisons the entry (warning). Warm, rank 1 takes the host ISA's entry: on an AVX512 host it
computes garbage (every step the job checks a compiled `sin(x) * y + 1` on 1000 floats against
eager and prints how many elements differ; critical), on an AVX2 host it crashes building it. Private cache dirs per rank are the control: nothing is shared.
"""

from __future__ import annotations

import json
import re
import time
import uuid

import pytest
import torch

from tests.e2e.jobs import WRAPPER, api, finish, running, torchrun

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]

JOB = ["demo/scenarios.py", "--steps", "2", "--elementwise-check", "--eager-model"]
# rank 0 runs the host's own ISA, rank 1 the next lower one: AVX512 hosts pair it with AVX2, AVX2 hosts
# (no AVX512) with ATen's scalar DEFAULT; either way one FX key, two different C++ kernels
HOST_ISA = torch.backends.cpu.get_cpu_capability()
LOWER_ISA = {"AVX512": "AVX2", "AVX2": "DEFAULT"}[HOST_ISA]
LOWER = {"ATEN_CPU_CAPABILITY": LOWER_ISA.lower()}
MISMATCH = re.compile(r"rank (\d): compiled != eager in (\d+) of 1000 elements")


def isa_job(stack, token: str, key: str, tmp_path, per_rank: dict, cache_dir=None) -> str:
    """The 2-rank job under per-rank settings; returns its output (all ranks)."""
    env = {"PER_RANK_ENV": json.dumps(per_rank)}
    if cache_dir is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    with running(
        torchrun(
            stack, token, key, str(WRAPPER), JOB, tmp_path / f"spool-{key}", ranks=2, extra_env=env, via_agent_cli=False
        )
    ) as job:
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


def test_cold_shared_cache_with_another_isa_on_rank_1_warns(stack, team, tmp_path):
    """Both ranks miss and compile different code under one key in one directory: a warning naming
    rank 1 (no strict majority of 2: rank 0 is the reference), with both ISAs in the details."""
    token, feed = team
    key = f"isa-cold-{uuid.uuid4().hex[:6]}"
    # The helper is both ranks' first and only compile, so both miss it and each runs its own code.
    output = isa_job(stack, token, key, tmp_path, {"1": LOWER}, cache_dir=tmp_path / "shared-cache")
    feed.wait_for({"rank_specific_artifact"}, 60, run=key)
    helper, found = elementwise_alert(stack, token, key, "warning")
    assert helper["ranks"] == [1]
    assert helper["details"]["codegen"] == {"0": {"cpu_capability": HOST_ISA}, "1": {"cpu_capability": LOWER_ISA}}
    assert helper["details"]["cache"] == {"0": "miss", "1": "miss"}
    assert helper["details"]["shared_dir"] == str(tmp_path / "shared-cache")
    assert all(a["ranks"] == [1] for a in found.values()), found
    assert not MISMATCH.search(output), output  # each rank ran the code it compiled itself


def test_warm_shared_cache_loaded_by_a_lower_isa_rank_is_named_and_the_control_is_quiet(stack, team, tmp_path):
    """The control comes first: same ISAs, a cache dir per rank, so each rank compiles its own code into
    its own dir; it computes right and raises no rank_specific_artifact, and rank 0's dir is then warm
    with the host ISA's entries. Then rank 1 (the lower ISA) takes that entry. On an AVX512 host rank
    1 loads the AVX512 code: critical, and the job itself shows rank 1's compiled helper disagreeing
    with eager. On an AVX2 host rank 1 (scalar) cannot even build the AVX2 code it loaded, and crashes
    in the helper's compile: named as such."""
    token, feed = team
    warm = tmp_path / "warm-cache"
    control = f"isa-ctl-{uuid.uuid4().hex[:6]}"
    private = {
        "0": {"TORCHINDUCTOR_CACHE_DIR": str(warm)},
        "1": {**LOWER, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "rank1-cache")},
    }
    output = isa_job(stack, token, control, tmp_path, private)
    assert not MISMATCH.search(output), output
    assert f"rank 1: elementwise check ({LOWER_ISA}, 2 steps): compiled == eager at every step" in output

    key = f"isa-warm-{uuid.uuid4().hex[:6]}"
    if HOST_ISA == "AVX512":
        _loads_and_computes_garbage(stack, token, feed, key, tmp_path, warm)
    else:
        _cannot_build_what_it_loaded(stack, token, feed, key, tmp_path, warm)
    # The control's slots settled long before the second run's alerts came: still nothing about it.
    assert "rank_specific_artifact" not in feed.latest(control)
    assert artifacts(stack, token, control) == {}


def _loads_and_computes_garbage(stack, token, feed, key, tmp_path, warm) -> None:
    output = isa_job(stack, token, key, tmp_path, {"1": LOWER}, cache_dir=warm)
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


def _cannot_build_what_it_loaded(stack, token, feed, key, tmp_path, warm) -> None:
    env = {"PER_RANK_ENV": json.dumps({"1": LOWER}), "TORCHINDUCTOR_CACHE_DIR": str(warm)}
    with running(
        torchrun(
            stack, token, key, str(WRAPPER), JOB, tmp_path / f"spool-{key}", ranks=2, extra_env=env, via_agent_cli=False
        )
    ) as job:
        output = job.communicate(timeout=180)[0].decode(errors="replace")
    assert job.returncode != 0 and "CppCompileError" in output, output[-4000:]
    got = feed.wait_for({"compile_failure_divergence", "rank_crashed"}, 60, run=key)
    failed = got["compile_failure_divergence"]
    assert failed["ranks"] == [1] and failed["frame"].endswith(":elementwise"), failed
    crashes = [a for a in api(stack, token, f"/runs/{key}/alerts").json()["alerts"] if a["kind"] == "rank_crashed"]
    assert any(a["ranks"] == [1] and a["frame"].endswith(":elementwise") for a in crashes), crashes
