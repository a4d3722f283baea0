"""A run page left open stays true (issue 52, item 1), run.js alone in headless Chromium: a stand-in
websocket, the page and its `now` answers served by Playwright routes. News on the socket makes the page
read the run again and redraw its header, counts, ranks table and strip; an ended run's strip says it
ended, whatever progress comes after; a page whose socket is down says as of when, and reads what it
missed when the socket is back."""

from __future__ import annotations

import json
from pathlib import Path

from tests.browser import chromium_page
from tests.stack import ROOT

RUN_JS = Path(ROOT, "dashboard/web/static/lockstep/run.js").read_text()
ORIGIN = "http://lockstep.test"
PAGE = f"""<!doctype html><meta charset="utf-8">
<p class="summary"><span id="run-status"><span class="badge status-running">running</span></span> · last step
<span id="run-last-step">0</span> · <span id="live-status" class="live" data-now="/api/v1/runs/r/now?page=1">connecting…</span></p>
<p class="verdict">Verdict: <span id="run-verdict" class="badge verdict-in_lockstep" data-verdict="in_lockstep">in lockstep</span></p>
<ul id="incidents"><li class="none">No incident so far.</li></ul>
<ol id="strip" class="strip"><li class="none">No progress sample yet.</li></ol>
<ul id="alerts" data-run="r"></ul>
<ul id="counts"><li><b data-count="compiles">0</b> compiles</li><li><b data-count="frames">0</b> frames</li></ul>
<table><tbody id="rank-rows"><tr><td>2</td><td>node0</td><td>running</td><td>–</td><td>10:00:00</td></tr></tbody></table>
<script>window.sockets = []; window.WebSocket = class {{ constructor() {{ window.sockets.push(this); }} }};</script>
<script>{RUN_JS}</script>"""

INDUCTOR = "/tmp/torchinductor_root/ab/cab7xyz.py:12 call"


def now(status: str, verdict: str, over: bool, compiles: int) -> dict:
    return {
        "key": "r",
        "status": status,
        "over": over,
        "ended": "The run ended after step 3; its last report came at 2026-01-01 10:00:09." if over else None,
        "verdict": {"kind": verdict, "text": verdict.replace("_", " ")},
        "last_step": 3,
        "counts": {"compiles": compiles, "frames": 2},
        "ranks": [
            {"rank": 2, "host": "node0", "status": "error" if over else "running", "last_step": 3, "seen": "10:00:09"}
        ],
        "ranks_page": 1,
        "as_of": "2026-01-01T10:00:10+00:00",
    }


def progress(ended: int, strip: list[dict] | None = None) -> dict:
    message = {
        "type": "progress",
        "run": "r",
        "last_step": 3,
        "min_step": 3,
        "ranks_reporting": 4,
        "ranks_ended": ended,
    }
    return {**message, "strip": strip} if strip else message


COMPILING = {
    "rank": 2,
    "phase": "compiling",
    "for_s": 14.0,
    "step": 0,
    "since_step_s": 20.0,
    "op": "",
    "where": INDUCTOR,
    "holding": False,
}


def test_news_on_the_socket_redraws_the_page_and_an_ended_run_stops_claiming_phases():
    answers = [now("running", "in_lockstep", False, 0)]
    reads: list[str] = []

    def serve_now(route):
        reads.append(route.request.url)
        route.fulfill(status=200, content_type="application/json", body=json.dumps(answers[-1]))

    with chromium_page(ORIGIN) as page:
        page.route(f"{ORIGIN}/runs/r/", lambda route: route.fulfill(status=200, content_type="text/html", body=PAGE))
        page.route(f"{ORIGIN}/api/v1/runs/r/now*", serve_now)
        page.goto(f"{ORIGIN}/runs/r/")
        feed = "([i, m]) => window.sockets[i].onmessage({data: JSON.stringify(m)})"
        page.evaluate("window.sockets[0].onopen()")
        page.wait_for_function("document.getElementById('live-status').textContent === 'live'")
        page.evaluate(feed, [0, progress(0, [COMPILING])])
        rank = page.locator("#strip li.rank-now.compiling")
        assert rank.locator("span").all_inner_texts() == [
            "rank 2",
            "compiling",
            "for 14 s",
            "step 0",
            "20 s into it",
            INDUCTOR,
        ]

        answers.append(now("failed", "failed", True, 5))  # rank 2 raised, the job ended: the counts moved
        page.evaluate(feed, [0, progress(4)])
        page.wait_for_selector("#run-status .status-failed", timeout=5000)
        assert page.locator("#run-status").inner_text() == "failed"
        assert page.get_attribute("#run-verdict", "data-verdict") == "failed"
        assert page.locator("#counts [data-count=compiles]").inner_text() == "5"
        assert page.locator("#rank-rows td").all_inner_texts() == ["2", "node0", "error", "3", "10:00:09"]
        assert page.locator("#rank-rows a").get_attribute("href") == "ranks/2/"
        assert (
            page.locator("#strip").inner_text()
            == "The run ended after step 3; its last report came at 2026-01-01 10:00:09."
        )
        assert page.locator("#live-status").inner_text() == "ended"
        page.evaluate(feed, [0, progress(4, [COMPILING])])  # a late sample of the ended run changes nothing
        assert (
            page.locator("#strip li.rank-now").count() == 0 and "compiling" not in page.locator("#strip").inner_text()
        )

        answers.append(now("failed", "recovered", True, 5))
        read_before = len(reads)
        page.evaluate("window.sockets[0].onclose()")  # the socket drops; the page reconnects and reads again
        page.wait_for_function("window.sockets.length === 2", timeout=5000)
        page.evaluate("window.sockets[1].onopen()")
        page.wait_for_selector("#run-verdict[data-verdict=recovered]", timeout=5000)
        assert len(reads) > read_before


def test_a_page_whose_socket_is_down_says_as_of_when():
    with chromium_page(ORIGIN) as page:
        page.route(f"{ORIGIN}/runs/r/", lambda route: route.fulfill(status=200, content_type="text/html", body=PAGE))
        page.route(f"{ORIGIN}/api/v1/runs/r/now*", lambda route: route.abort())
        page.goto(f"{ORIGIN}/runs/r/")
        page.evaluate("window.sockets[0].onopen(); window.sockets[0].onclose()")
        status = page.locator("#live-status")
        assert status.get_attribute("data-stale") == "true"
        text = status.inner_text()
        assert text.startswith("reconnecting… (shown as of ") and len(text.split("as of ")[1]) == len("10:00:00)"), text
