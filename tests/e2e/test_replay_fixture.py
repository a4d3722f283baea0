"""CUDA-era data through the real stack: the TORCH_TRACE logs of a 2-rank H200 job
(tests/fixtures/trace_211_cuda.tgz) replayed with `python -m agents replay`."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import uuid

import pytest

from tests.e2e.jobs import alert_feed, api, member_session, project_with_token
from tests.stack import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]
FIXTURE = ROOT / "tests" / "fixtures" / "trace_211_cuda.tgz"


def test_replayed_h200_trace_raises_the_recompile_divergence(stack, tmp_path):
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path / "trace", filter="data")
    project, token = project_with_token("replay")
    feed = alert_feed(stack, member_session(project, "rp"))
    key = f"replay-{uuid.uuid4().hex[:6]}"
    cmd = [
        sys.executable,
        "-m",
        "agents",
        "replay",
        str(tmp_path / "trace"),
        "--run",
        key,
        "--url",
        stack.url,
        "--token",
        token,
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    alerts = feed.wait_for({"recompile_divergence"}, 60, run=key)
    feed.ws.close()
    recompile = alerts["recompile_divergence"]
    assert recompile["ranks"] == [1] and "size mismatch" in recompile["message"]
    assert "graph_divergence" not in feed.latest(key)  # cuda:0 vs cuda:1 graphs normalize equal
    run = api(stack, token, f"/runs/{key}").json()
    assert [r["rank"] for r in run["ranks"]] == [0, 1]
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0
    assert api(stack, token, f"/runs/{key}").json()["summary"] == run["summary"]  # replay is idempotent
