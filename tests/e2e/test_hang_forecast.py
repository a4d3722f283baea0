"""hang_forecast on real 2-rank gloo jobs (demo/hang_job.py): rank 1 falls behind, rank 0 waits in the
next all_reduce, and the forecast reaches the websocket before the collective timeout kills the job
(three ranks, two of them waiting: tests/e2e/test_flight_recorder.py).

Both stalls are real: a guard failure that makes Dynamo compile a fresh, large unrolled graph on rank 1
only, and a DataLoader item that never arrives. The collective timeout is 20 s, so the forecast comes
at half of it (10 s, critical) and the job then dies of the timeout, as users see it."""

from __future__ import annotations

import time

import pytest

from tests.browser import chromium_page
from tests.e2e.jobs import alert_feed, member_session, project_with_token, running, torchrun, wait_for_run
from tests.stack import unique

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]

TIMEOUT_S = 20


def hang(stack, tmp_path, stall: str, depth: int = 20, extra: tuple[str, ...] = ()):
    project, token = project_with_token(f"hang-{stall}")
    session = member_session(project, f"hang-{stall}")
    feed = alert_feed(stack, session)
    run_key = unique(f"hang-{stall}")
    job = torchrun(
        stack,
        token,
        run_key,
        "demo/hang_job.py",
        ["--stall", stall, "--timeout", str(TIMEOUT_S), "--depth", str(depth), *extra],
        tmp_path / "spool",
        ranks=2,
    )
    return project, token, session, feed, run_key, job


def until_dead(job, timeout: float = 240) -> tuple[int, str]:
    output, _ = job.communicate(timeout=timeout)
    return job.returncode, output.decode(errors="replace")


def test_a_slow_recompile_on_one_rank_is_forecast_before_the_timeout(stack, tmp_path):
    _, token, _, feed, run_key, job = hang(stack, tmp_path, "compile")
    with running(job):
        wait_for_run(stack, token, run_key, job)
        alert = feed.wait_for({"hang_forecast"}, timeout=180, run=run_key)["hang_forecast"]
        alive_at_forecast = job.poll() is None
        forecast_at = time.monotonic()
        code, output = until_dead(job)
        died_after = time.monotonic() - forecast_at
    assert alive_at_forecast, output[-4000:]
    assert alert["ranks"] == [1] and alert["details"]["waiting"] == [0] and alert["step"] == 2
    assert alert["frame"].startswith("hang_job.py:") and alert["frame"].endswith(":Net.forward")
    assert f"rank 1 is compiling {alert['frame']}" in alert["message"]
    assert "recompile because of" in alert["message"] and "depth" in alert["message"]  # the failed guard
    assert "in all_reduce of step 2" in alert["message"] and f"{TIMEOUT_S} s collective timeout" in alert["message"]
    assert alert["severity"] == "critical" and 0 <= alert["details"]["left_s"] <= TIMEOUT_S / 2
    assert code != 0 and "recompiles a 20-layer graph" in output
    assert "step 2 done" not in output  # nobody got past the all_reduce: the timeout ended the job
    assert died_after < TIMEOUT_S + 60


def test_a_stuck_data_loader_under_ddp_is_named_and_the_page_strip_shows_it_first(stack, tmp_path):
    """DDP(torch.compile(model)) and rank 1 stuck in its data loader: the waiting ranks' main threads sit
    in DDP's bucket all-reduce inside autograd (C++), which the sampler sees as backward. The forecast
    names the loader's frame; the run page's strip shows rank 1 first, live."""
    _, token, session, feed, run_key, job = hang(stack, tmp_path, "data", extra=("--ddp",))
    with running(job), chromium_page(stack.url, session) as browser:
        wait_for_run(stack, token, run_key, job)
        browser.goto(f"{stack.url}/runs/{run_key}/")
        page = alert_feed(stack, session, f"/ws/runs/{run_key}/")
        alert = feed.wait_for({"hang_forecast"}, timeout=180, run=run_key)["hang_forecast"]
        alive_at_forecast = job.poll() is None
        strips = [m["strip"] for m in page.progress if m.get("strip")]
        shown = browser.wait_for_selector("#strip > li.holding:first-child", timeout=30_000)
        shown_text, shown_rank = shown.inner_text(), shown.get_attribute("data-rank")
    assert alive_at_forecast  # the job is stopped here: the first test shows the timeout ending it
    assert alert["ranks"] == [1] and alert["details"]["waiting"] == [0] and alert["step"] == 2
    assert alert["frame"] is None and "in backward (DDP's all-reduce) of step 2" in alert["message"]
    assert "rank 1 is waiting in the data loader at hang_job.py:" in alert["message"]
    assert ":__getitem__" in alert["message"]
    held = [s for s in strips if s[0]["holding"]]
    assert held, strips[-3:]
    first = held[-1][0]
    assert first["rank"] == 1 and first["phase"] == "data" and first["since_step_s"] > 5
    assert {row["phase"] for row in held[-1][1:]} == {"backward"}
    assert shown_rank == "1" and "data" in shown_text and "holding the others up" in shown_text  # the page, live
