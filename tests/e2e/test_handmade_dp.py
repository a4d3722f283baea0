"""Replicas recognised by what they do, on a real 3-rank gloo job under the zero-code agent
(demo/handmade_dp_job.py): gradients averaged by a hand-written all-reduce, not torch's DDP, and
rank 2's model initialised from another seed. Beside it each rank trains a head of its own (a
second optimizer, never averaged), which must never be compared."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.e2e.jobs import api, finish, running, torchrun

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]


def settled_incidents(stack, token: str, key: str, timeout: float = 60) -> list[dict]:
    """The run's incidents once every grad slot settled (the run's end settles what is left)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = api(stack, token, f"/runs/{key}/incidents").json()["incidents"]
        if found:
            return found
        time.sleep(0.5)
    return []


def test_a_hand_written_all_reduce_with_one_rank_seeded_apart_is_one_incident_at_that_rank(stack, team, tmp_path):
    token, feed = team
    key = f"handmade-{uuid.uuid4().hex[:6]}"
    args = ["--steps", "6", "--seed-rank", "2"]
    with running(torchrun(stack, token, key, "demo/handmade_dp_job.py", args, tmp_path / "spool")) as job:
        finish(job)
    alerts = feed.wait_for({"param_divergence"}, 60, run=key)
    divergence = alerts["param_divergence"]
    assert divergence["ranks"] == [2] and divergence["step"] == 0
    assert divergence["details"]["group"] == "local"  # the replicated MLP, never the heads (local.1)
    assert any(name.startswith(("0.", "2.")) for name in divergence["details"]["parameters"])  # module paths
    incidents = settled_incidents(stack, token, key)
    assert [(i["root"]["kind"], i["root"]["ranks"]) for i in incidents] == [("param_divergence", [2])]
    stored = api(stack, token, f"/runs/{key}/alerts").json()["alerts"]
    assert {a["kind"] for a in stored} == {"param_divergence"}, stored
