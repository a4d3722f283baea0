"""The run page's live incidents keep the server's step order (run.js, in headless Chromium, fed by a
stand-in websocket): a new incident goes after those of its root step and before later ones, one with
no step last; an update keeps its place unless its root step changed."""

from __future__ import annotations

from pathlib import Path

from tests.browser import chromium_page
from tests.stack import ROOT

RUN_JS = Path(ROOT, "dashboard/web/static/lockstep/run.js").read_text()
PAGE = f"""<span id="live-status"></span><ul id="alerts" data-run="r"></ul>
<ul id="incidents"><li class="none">No incident so far.</li></ul>
<script>window.sockets = []; window.WebSocket = class {{ constructor() {{ window.sockets.push(this); }} }};</script>
<script>{RUN_JS}</script>"""


def incident(number: int, step: int | None) -> dict:
    root = {"kind": f"kind{number}", "ranks": [number], "step": step, "message": "m"}
    return {
        "type": "incident",
        "incident": {"id": number, "severity": "critical", "state": "firing", "acked_by": None, "root": root},
    }


def test_live_incidents_are_placed_by_their_root_step():
    with chromium_page("http://127.0.0.1") as page:
        page.set_content(PAGE)
        for number, step in [(1, 12), (2, None), (3, 5), (4, 12), (5, 0), (1, 12), (3, 20)]:
            page.evaluate("m => window.sockets[0].onmessage({data: JSON.stringify(m)})", incident(number, step))
        shown = page.eval_on_selector_all("#incidents > li", "items => items.map(li => li.dataset.id)")
    assert shown == ["5", "1", "4", "3", "2"]  # steps 0, 12, 12 (in the order they came), 20 (moved), none
