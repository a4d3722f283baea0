"""Project B attacks project A through every endpoint, page and websocket of a running stack.

Every attempt must answer exactly as if A's run, alert or silence did not exist (a 404, or a list
without it), and change nothing of A's. The test counts attempts and the ones that got through
(target 0), for the README's reliability table (`record_property`).
"""

from __future__ import annotations

import json
import time

import pytest
import requests
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from agents import protocol
from dashboard.delivery import notify
from dashboard.detection.models import Alert, Silence
from dashboard.evidence.models import Blob
from dashboard.tenancy.models import Run
from tests import claims
from tests.conftest import make_batch
from tests.e2e.jobs import alert_feed

pytestmark = [pytest.mark.e2e]
MISSING = "no-such-run-anywhere"


class Attempts:
    """Each attack and whether it got through (revealed or changed anything of the victim's)."""

    def __init__(self) -> None:
        self.made: list[str] = []
        self.through: list[str] = []

    def check(self, what: str, held: bool) -> None:
        self.made.append(what)
        if not held:
            self.through.append(what)


def _session(side, stack) -> requests.Session:
    http = requests.Session()
    http.cookies.set("sessionid", side.session)
    http.get(f"{stack.url}/alerts/", timeout=10)  # the CSRF cookie
    http.headers.update({"X-CSRFToken": http.cookies.get("csrftoken", ""), "Referer": stack.url + "/"})
    return http


def _like_missing(response: requests.Response, missing: requests.Response, key: str) -> bool:
    """The same status and body as for a key that exists nowhere (the key's name aside)."""
    return (response.status_code, response.text.replace(key, MISSING)) == (missing.status_code, missing.text)


def test_project_b_gets_nothing_of_project_a(stack, victim, attacker, record_property):
    tried = Attempts()
    url, key, alert_id = stack.url, victim.key, victim.alert.id
    before = (claims.count(run=victim.run), victim.alert.acked_at, victim.silence.expires_at)
    token_api = requests.Session()
    token_api.headers.update(attacker.bearer())
    browser = _session(attacker, stack)

    for door, http in (("token", token_api), ("session", browser)):
        for path in ("/api/v1/runs/{}", "/api/v1/runs/{}/alerts", "/api/v1/runs/{}/timeline"):
            got, missing = (
                http.get(url + path.format(key), timeout=10),
                http.get(url + path.format(MISSING), timeout=10),
            )
            tried.check(f"{door} GET {path}", got.status_code == 404 and _like_missing(got, missing, key))
        got = http.get(f"{url}/api/v1/compare?runs={key},{attacker.key}", timeout=10)
        missing = http.get(f"{url}/api/v1/compare?runs={MISSING},{attacker.key}", timeout=10)
        tried.check(f"{door} GET compare", got.status_code == 404 and _like_missing(got, missing, key))
        listed = http.get(f"{url}/api/v1/runs", timeout=10).json()["runs"]
        tried.check(f"{door} GET runs list", key not in {r["key"] for r in listed})
        for body, path in (
            ({"baseline": key}, f"/api/v1/runs/{attacker.key}/baseline"),
            ({"baseline": attacker.key}, f"/api/v1/runs/{key}/baseline"),
        ):
            tried.check(f"{door} POST {path}", http.post(url + path, json=body, timeout=10).status_code == 404)
    tried.check(
        "token ack", token_api.post(f"{url}/api/v1/alerts/{alert_id}/ack", timeout=10).status_code in (403, 404)
    )
    got = browser.post(f"{url}/api/v1/alerts/{alert_id}/ack", timeout=10)
    missing = browser.post(f"{url}/api/v1/alerts/999999999/ack", timeout=10)
    tried.check(
        "session API ack", got.status_code == 404 and got.text.replace(str(alert_id), "999999999") == missing.text
    )
    silence = browser.post(f"{url}/api/v1/silences", json={"run": key, "hours": 1, "comment": "x"}, timeout=10)
    tried.check("API silence on A's run", silence.status_code == 400)

    for path in (
        f"/runs/{key}/",
        f"/runs/{key}/ranks/0/",
        f"/runs/{key}/frame/?f=x",
        f"/compare/?runs={key},{attacker.key}",
        f"/compare/frame/?runs={key},{attacker.key}&f=x",
    ):
        page = browser.get(url + path, timeout=10, allow_redirects=False)
        tried.check(f"page {path}", page.status_code == 404 and key not in page.text)
    for path in ("/", "/alerts/?state=all"):
        tried.check(f"page {path}", key not in browser.get(url + path, timeout=10).text)
    form = {"csrfmiddlewaretoken": browser.cookies.get("csrftoken", ""), "next": "/alerts/"}
    for path in (
        f"/alerts/{alert_id}/ack/",
        f"/alerts/{alert_id}/unack/",
        f"/silences/{victim.silence.id}/expire/",
        f"/runs/{key}/baseline/",
    ):
        tried.check(
            f"page POST {path}",
            browser.post(
                url + path, data={**form, "baseline": attacker.key}, timeout=10, allow_redirects=False
            ).status_code
            == 404,
        )
    browser.post(url + "/silences/", data={**form, "run": key, "hours": 1, "comment": "mute them"}, timeout=10)
    tried.check(
        "page silence on A's run", not Silence.objects.filter(run=victim.run).exclude(id=victim.silence.id).exists()
    )
    tried.check("admin", "/login/" in browser.get(f"{url}/admin/", timeout=10).url)

    ws = stack.url.replace("http", "ws")
    for path in (f"/ws/runs/{key}/", f"/ws/runs/{MISSING}/"):
        try:
            connect(
                ws + path,
                additional_headers={"Origin": url, "Cookie": f"sessionid={attacker.session}"},
                open_timeout=10,
            ).close()
            refused = False
        except InvalidStatus as exc:
            refused = exc.response.status_code == 403
        tried.check(f"websocket {path}", refused)
    theirs, ours = alert_feed(stack, attacker.session), alert_feed(stack, victim.session)
    try:
        time.sleep(0.5)  # both subscribed
        notify.push([Alert.objects.select_related("run").get(id=alert_id)])
        ours.wait_for({"grad_divergence"}, timeout=10)  # the positive control: A's member hears it
        time.sleep(0.5)
        tried.check("websocket alerts feed", theirs.alerts == [])
    finally:
        theirs.ws.close()
        ours.ws.close()

    # last: B creating its own run of the same key is allowed (keys are per project), and then B sees it
    stolen = requests.post(
        f"{url}/api/v1/ingest",
        json=make_batch(run=key, world_size=2, session="sess-attacker-0"),
        headers=attacker.bearer(),
        timeout=10,
    )
    tried.check(
        "ingest into A's key",
        stolen.status_code == 200 and claims.count(run=victim.run) == before[0],
    )
    text = "def forward(self, x):\n    return x * 17\n"
    blob = requests.post(
        f"{url}/api/v1/blobs",
        json={"v": 1, "blobs": [{"hash": protocol.blob_hash(text), "text": text}]},
        headers=attacker.bearer(),
        timeout=10,
    )
    tried.check(
        "unasked blob", blob.json()["stored"] == [] and not Blob.objects.filter(hash=protocol.blob_hash(text)).exists()
    )
    mine = requests.post(
        f"{url}/api/v1/ingest", json=make_batch(run=key, world_size=2, seq=1), headers=victim.bearer(), timeout=10
    )
    tried.check("A's job still ingests", mine.status_code == 200 and not mine.json()["duplicate"])

    victim.alert.refresh_from_db()
    victim.silence.refresh_from_db()
    tried.check("A's alert and silence unchanged", (victim.alert.acked_at, victim.silence.expires_at) == before[1:])
    record_property("attempts", len(tried.made))
    record_property("through", len(tried.through))
    print(f"\ncross-project drill: {len(tried.made)} attempts, {len(tried.through)} got through")
    assert tried.through == [], json.dumps(tried.through)
    assert Run.objects.filter(key=key).count() == 2  # B's own run of that key: separate, A's untouched
