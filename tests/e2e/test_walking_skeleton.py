"""The whole path, real parts only: a 3-rank gloo torchrun job with DDP(torch.compile(model)) and the
agent -> uvicorn (ASGI, Channels) -> PostgreSQL -> Celery worker -> Redis channel layer -> websocket
and the run page in headless Chromium.

Rank 1 gets a 17-row batch at step 3 (it alone recompiles) and nudges one gradient at step 9.
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests.browser import chromium_page
from tests.e2e.jobs import alert_feed, api, finish, member_session, project_with_token, running, torchrun, wait_for_run

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]

SHAPE_STEP, PERTURB_STEP, STEPS = 3, 9, 12
# one alert per desync; rank 1's weights, asked after its nudged gradient, confirm it when the answer comes
# before the job ends (it does on a loaded machine, where the job's last steps run slower)
REQUIRED = {"grad_divergence", "recompile_divergence", "cache_divergence"}


def test_divergences_reach_websocket_and_run_page(stack, tmp_path):
    project, token = project_with_token("e2e")
    session = member_session(project, "alice")
    feed = alert_feed(stack, session)
    run_key = f"e2e-{uuid.uuid4().hex[:8]}"
    args = [
        "--steps",
        str(STEPS),
        "--sleep",
        "0.4",
        "--shape-rank",
        "1",
        "--shape-step",
        str(SHAPE_STEP),
        "--perturb-rank",
        "1",
        "--perturb-step",
        str(PERTURB_STEP),
    ]
    with running(torchrun(stack, token, run_key, "demo/ddp_job.py", args, tmp_path / "spool")) as job:
        wait_for_run(stack, token, run_key, job)
        with chromium_page(stack.url, session) as page:
            page.goto(f"{stack.url}/runs/{run_key}/")
            page.wait_for_selector("#live-status:text('live')", timeout=15_000)
            assert page.locator("li.alert[data-kind=grad_divergence]").count() == 0  # not there at load time
            page.wait_for_selector("li.alert[data-kind=grad_divergence]", timeout=120_000)
            page.wait_for_selector("li.alert[data-kind=recompile_divergence]", timeout=60_000)
            shown = page.locator("li.alert[data-kind=grad_divergence]").inner_text()
            assert "ranks 1" in shown and f"step {PERTURB_STEP}" in shown
            recompile = page.locator("li.alert[data-kind=recompile_divergence]").inner_text()
            assert "ranks 1" in recompile and "size mismatch" in recompile
            assert page.evaluate("performance.getEntriesByType('navigation').length") == 1  # no reload
        finish(job)
    alerts = feed.wait_for({"grad_divergence", "recompile_divergence"}, timeout=30)
    feed.ws.close()

    grad, recompile = alerts["grad_divergence"], alerts["recompile_divergence"]
    assert (grad["ranks"], grad["step"], grad["severity"], grad["run"]) == ([1], PERTURB_STEP, "critical", run_key)
    assert grad["details"]["tie"] is False and grad["details"]["buckets"]
    assert (recompile["ranks"], recompile["step"]) == ([1], SHAPE_STEP)
    assert "size mismatch" in recompile["message"] and recompile["frame"]
    # nothing false: the lone recompile's cache lookups are a finding caused by it, on the same rank
    kinds = set(feed.latest())
    assert REQUIRED <= kinds <= REQUIRED | {"param_divergence"}, kinds
    lookups = feed.latest()["cache_divergence"]
    assert lookups["ranks"] == [1] and lookups["details"].get("cause") == "recompile_divergence", lookups
    assert all(feed.latest()[kind]["ranks"] == [1] for kind in kinds)
    assert len({a["id"] for a in feed.alerts}) == len(kinds)  # one alert per desync
    progress = [p for p in feed.progress if p["run"] == run_key]
    assert progress and progress[-1]["world_size"] == 3 and progress[-1]["last_step"] is not None

    stored = _alerts_once_explained(stack, token, run_key)
    stored_kinds = [a["kind"] for a in stored]
    assert len(stored_kinds) == len(set(stored_kinds)) and REQUIRED <= set(stored_kinds) <= REQUIRED | {
        "param_divergence"
    }
    assert all(a["ranks"] == [1] for a in stored), stored
    incidents = api(stack, token, f"/runs/{run_key}/incidents").json()["incidents"]
    assert {tuple(i["root"]["ranks"]) for i in incidents} == {(1,)}  # every page names rank 1, nobody else
    assert sorted(a for i in incidents for a in i["alerts"]) == sorted(a["id"] for a in stored)
    [named] = [a["details"]["params"] for a in stored if a["kind"] == "grad_divergence"]
    assert len(named) == 1 and named[0].endswith("0.weight"), named  # the nudged parameter, by name
    [members] = [a["details"]["bucket_params"] for a in stored if a["kind"] == "grad_divergence"]
    assert named[0] in [name for names in members.values() for name in names]  # its bucket, from rank_start
    run = api(stack, token, f"/runs/{run_key}").json()
    assert [r["rank"] for r in run["ranks"]] == [0, 1, 2]
    assert {r["status"] for r in run["ranks"]} == {"ok"}
    assert run["status"] == "finished" and run["last_step"] == STEPS - 1


def _alerts_once_explained(stack, token: str, run_key: str, timeout: float = 30) -> list[dict]:
    """The grad alert gains the parameter names once the asked ranks answered (detail events)."""
    deadline = time.monotonic() + timeout
    while True:
        alerts = api(stack, token, f"/runs/{run_key}/alerts").json()["alerts"]
        if (
            any("params" in a["details"] for a in alerts if a["kind"] == "grad_divergence")
            or time.monotonic() > deadline
        ):
            return alerts
        time.sleep(0.5)
