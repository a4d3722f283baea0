"""A gradient divergence on a real 3-rank gloo torchrun job (DDP(torch.compile(model)), the agent,
the real stack): the server asks every rank for its weights a few steps later (how many depends on
the run's pace and the detection latency), param_divergence confirms the damage before the job ends,
long before the agent's next regular weight fingerprint (step 50), and the gradient alert stays open
(a clean later gradient step does not close it)."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.e2e.jobs import api, finish, project_with_token, running, torchrun

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]

PERTURB_STEP, STEPS = 4, 30  # room for a settle that a loaded machine delays by seconds


def test_weights_are_compared_a_step_or_two_after_a_gradient_divergence(stack, tmp_path):
    _, token = project_with_token(f"w-{uuid.uuid4().hex[:6]}")
    key = f"weights-{uuid.uuid4().hex[:6]}"
    args = ["--steps", str(STEPS), "--sleep", "0.3", "--perturb-rank", "2", "--perturb-step", str(PERTURB_STEP)]
    with running(torchrun(stack, token, key, "demo/ddp_job.py", args, tmp_path / "spool")) as job:
        finish(job)
    alerts = stored(stack, token, key, {"grad_divergence", "param_divergence"})
    grad, weights = alerts["grad_divergence"], alerts["param_divergence"]
    assert (grad["ranks"], grad["step"]) == ([2], PERTURB_STEP)
    assert weights["ranks"] == [2] and PERTURB_STEP < weights["step"] < STEPS, (
        weights["step"],
        weights["message"],
        grad,
    )
    assert grad["state"] == "firing" or grad["resolve_reason"] == "run ended"


def stored(stack, token: str, key: str, kinds: set[str], timeout: float = 60) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while True:
        alerts = {a["kind"]: a for a in api(stack, token, f"/runs/{key}/alerts").json()["alerts"]}
        if kinds <= set(alerts) or time.monotonic() > deadline:
            assert kinds <= set(alerts), alerts
            return alerts
        time.sleep(0.5)
