"""A page left open stays true (issue 52, item 1), against the real stack: a run page and the runs list
opened while the run ran follow it, without a reload, when rank 2 raises (status failed, the verdict,
the counts, the ranks table, the strip) and when the job then ends (the strip says the run ended, not
that a rank is compiling). Protocol batches over HTTP, no torchrun; one Chromium, two tabs."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from dashboard.delivery import notify
from dashboard.tenancy.models import Run
from tests.browser import chromium_page
from tests.e2e.jobs import member_session, project_with_token
from tests.fixtures.pages_data import Job, job_batches
from tests.stack import unique
from tests.web.test_page_left_open import rank_rows_of

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]

INDUCTOR = "/tmp/torchinductor_root/ab/cab7xyzq.py:312 call"  # what a compiling rank's sample names


@pytest.fixture
def browser_orm():
    """Playwright's sync API keeps an event loop in this thread, which makes Django refuse ORM calls."""
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    yield
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def _stale_row(rank: int, phase: str) -> dict:
    return {"rank": rank, "phase": phase, "for_s": 15.0, "step": 4, "op": "forward", "where": INDUCTOR,
            "since_step_s": 16.0, "holding": False}  # fmt: skip


def send(stack, token: str, batches: list[dict]) -> None:
    with requests.Session() as http:
        http.headers["Authorization"] = f"Bearer {token}"
        for batch in batches:
            response = http.post(f"{stack.url}/api/v1/ingest", json=batch, timeout=10)
            assert response.status_code == 200, response.text


@contextlib.contextmanager
def heartbeats(stack, token: str, last: dict[int, dict], rank: int) -> Iterator[None]:
    """`rank` sends a heartbeat every 2 s meanwhile (`last[rank]` follows its batches)."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(2.0):
            batch = later(last[rank], [{"t": "heartbeat"}])
            send(stack, token, [batch])
            last[rank] = batch

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def later(batch: dict, events: list[dict]) -> dict:
    """The rank's next batch of its session."""
    return {**batch, "seq": batch["seq"] + 1, "events": [{"ts": time.time(), **e} for e in events]}


def test_run_page_and_runs_list_follow_a_crash_and_the_end_without_reload(stack, browser_orm):
    project, token = project_with_token("left-open")
    session = member_session(project, "lena")
    key = unique("left-open")
    running = [
        {**b, "events": [e for e in b["events"] if e["t"] != "rank_end"]} for b in job_batches(Job(key, steps=4))
    ]
    last = {b["rank"]: b for b in running}
    compiling = {"t": "progress", "phase": "compiling", "phase_s": 14.0, "step": 4, "since_step_s": 15.0}

    with chromium_page(stack.url, session) as run_page:
        # sent once the browser is up: its start on a loaded machine must not age the ranks past the
        # stack's LOCKSTEP_SILENT_AFTER (8 s) before the first look, which would read `stalled`
        send(stack, token, running + [later(last[2], [{**compiling, "where": INDUCTOR, "op": "forward"}])])
        last[2] = {**last[2], "seq": last[2]["seq"] + 1}
        # rank 0 reports every 2 s until the stale pushes are seen: on a loaded machine the waits below can
        # outlast the stack's 8 s of silence, after which the page reads the run as over (no phases at all)
        with heartbeats(stack, token, last, rank=0):
            run_page.goto(f"{stack.url}/runs/{key}/")
            runs_page = run_page.context.new_page()
            runs_page.goto(f"{stack.url}/")
            row = runs_page.locator(f"table.runs tr[data-run='{key}']")
            assert row.locator("td.status").inner_text() == "running"
            run_page.wait_for_selector("#live-status:text('live')", timeout=15_000)
            run_page.wait_for_selector("#strip li.rank-now.compiling[data-rank='2']", timeout=15_000)
            assert run_page.locator("#run-status").inner_text() == "running"
            assert run_page.get_attribute("#run-verdict", "data-verdict") == "in_lockstep"
            compiles = int(run_page.locator("#counts [data-count=compiles]").inner_text())
            frames = int(run_page.locator("#counts [data-count=frames]").inner_text())

            # rank 2 compiles one more frame and raises
            failure = {"t": "rank_end", "status": "error", "exit_code": 1, "reason": "RuntimeError: boom"}
            new_frame = {"t": "compile", "frame": "train.py:9:late", "index": 0, "compile_id": "9/0", "step": 4}
            send(stack, token, [later(last[2], [{**new_frame, "status": "ok"}, failure])])
            run_page.wait_for_selector("#run-status .status-failed", timeout=15_000)
            run_page.wait_for_selector("#run-verdict[data-verdict=failed]", timeout=15_000)
            assert int(run_page.locator("#counts [data-count=compiles]").inner_text()) == compiles + 1
            assert int(run_page.locator("#counts [data-count=frames]").inner_text()) == frames + 1
            assert run_page.locator("#rank-rows tr").nth(2).locator("td").nth(2).inner_text() == "error"
            run_page.wait_for_selector("#strip li.rank-now.ended[data-rank='2']", timeout=15_000)
            # a push computed before rank 2's end was stored (a sweep that read the ranks just before) does not
            # bring its phase back, and one whose strip lacks rank 2 (its last sample aged out) does not drop it
            run = Run.objects.get(key=key)
            stale_ranks = rank_rows_of([{"rank": r, "last_step": 4, "status": "running"} for r in range(4)])
            for mark, rows in (("stale-1", [2, 0]), ("stale-2", [0])):
                strip = [_stale_row(r, mark if r == 0 else "compiling") for r in rows]
                with ThreadPoolExecutor(1) as pool:  # a worker's push: asyncio.run, away from Playwright's loop
                    pool.submit(notify.push_progress, run, stale_ranks, strip).result()
                run_page.wait_for_selector(f"#strip li.rank-now.{mark}[data-rank='0']", timeout=15_000)
                assert run_page.locator("#strip li.rank-now[data-rank='2']").get_attribute("class") == "rank-now ended"
        runs_page.wait_for_selector(f"tr[data-run='{key}'] td.status .status-failed", timeout=15_000)
        assert row.locator("td.verdict [data-verdict]").get_attribute("data-verdict") == "failed"

        # the others are stopped: the run is over, and its page says so
        send(stack, token, [later(last[r], [{"t": "rank_end", "status": "ok", "exit_code": 0}]) for r in (0, 1, 3)])
        run_page.wait_for_selector("#strip li.ended:text('The run ended after step')", timeout=15_000)
        assert run_page.locator("#live-status").inner_text() == "ended"
        assert "compiling" not in run_page.locator("#strip").inner_text()
        assert run_page.locator("#run-status").inner_text() == "failed"
        for tab in (run_page, runs_page):
            assert tab.evaluate("performance.getEntriesByType('navigation').length") == 1  # no reload
