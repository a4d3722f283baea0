"""The dashboard in headless Chromium against the real stack (uvicorn + Celery worker): a live
alert appears without reload, acknowledge and silence work, the compare page shows the version
diff, user text stays inert, and one project's user cannot open another's run.

Runs are ingested as protocol batches over HTTP (no torchrun). One Chromium for the module.
Set LOCKSTEP_SCREENSHOTS=docs/screenshots to save the main pages as PNGs on the way.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import requests
from django.contrib.auth.models import User
from django.test import Client

from dashboard.detection.models import Alert
from dashboard.tenancy.models import Project, ProjectToken
from tests.browser import chromium_page
from tests.fixtures.pages_data import FRAMES, TORCH_211, Job, graph_blobs, job_batches
from tests.stack import unique

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]

XSS = "<script>window.pwned=1</script><img src=x onerror=window.pwned=1>"
SHOTS = os.environ.get("LOCKSTEP_SCREENSHOTS")


@pytest.fixture(scope="module")
def page(stack):
    """One Chromium for the module. Playwright's sync API keeps an event loop in this thread,
    which makes Django refuse ORM calls; the tests' ORM calls are plain sync code, so allow them."""
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with chromium_page(stack.url) as page:
            page.set_viewport_size({"width": 1280, "height": 900})
            yield page
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def team(stack):
    """A project with its token and a member whose session cookie the browser uses."""
    project = Project.objects.create(name=unique("vision"))
    token = ProjectToken.issue(project)
    user = User.objects.create_user(unique("ana"), password="pw-ana-123")
    project.members.add(user)
    client = Client()
    client.force_login(user)
    return project, token, client.cookies["sessionid"].value


def login(page, stack, session: str) -> None:
    page.context.clear_cookies()
    page.context.add_cookies([{"name": "sessionid", "value": session, "url": stack.url}])


def send(stack, token: str, batches: list[dict]) -> None:
    with requests.Session() as http:
        http.headers["Authorization"] = f"Bearer {token}"
        for batch in batches:
            response = http.post(f"{stack.url}/api/v1/ingest", json=batch, timeout=10)
            assert response.status_code == 200, response.text


def send_blobs(stack, token: str) -> None:
    response = requests.post(
        f"{stack.url}/api/v1/blobs", json=graph_blobs(), timeout=10, headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 200, response.text


def split(batches: list[dict], later) -> tuple[list[dict], list[dict]]:
    """Each rank's events before and after a cut, the later ones as a second agent session."""
    first, second = [], []
    for b in batches:
        early = [e for e in b["events"] if not later(e)]
        late = [e for e in b["events"] if later(e)]
        first.append({**b, "events": early})
        if late:
            second.append({**b, "session": b["session"] + "-2", "events": late})
    return first, second


def shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


def test_live_alert_then_acknowledge_and_silence(stack, page, team):
    _, token, session = team
    job = Job(
        "live-run",
        world=8,
        steps=13,
        grad_diverge=(5, 12),
        recompile=(3, 4),
        name="resnet ddp 8 ranks",
        graph_frame="demo/ddp_job.py:77:head",
    )
    before, after = split(
        job_batches(job), lambda e: e["t"] in ("grad", "step", "rank_end") and e.get("step", 99) >= 12
    )
    send(stack, token, before)
    login(page, stack, session)
    page.goto(f"{stack.url}/runs/live-run/")
    page.wait_for_selector("#live-status:text('live')", timeout=15_000)
    page.wait_for_selector("#timeline canvas", timeout=15_000)
    assert page.locator("li.alert[data-kind=grad_divergence]").count() == 0
    send(stack, token, after)
    page.wait_for_selector("li.alert[data-kind=grad_divergence]", timeout=30_000)
    shown = page.locator("li.alert[data-kind=grad_divergence]").inner_text()
    assert "ranks 5" in shown and "step 12" in shown
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1  # no reload
    page.wait_for_function("document.getElementById('timeline').dataset.drawn > 0", timeout=15_000)
    time.sleep(3.5)  # the charts refetch after the alert; let them settle for the screenshot
    shot(page, "run")

    # every rank ended: the sweep closes the run's alerts as ended unresolved, and the run keeps its outcome
    deadline = time.monotonic() + 60
    while Alert.objects.filter(run__key="live-run", state="firing").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert set(Alert.objects.filter(run__key="live-run").values_list("state", flat=True)) == {"ended_unresolved"}
    page.reload()
    page.wait_for_selector("#live-status[data-connected=true]", timeout=15_000)
    assert page.locator("#live-status").inner_text() == "ended"
    assert page.locator("#strip").inner_text().startswith("The run ended after step ")
    verdict = page.locator("p.verdict [data-verdict]")
    assert verdict.get_attribute("data-verdict") == "diverged" and verdict.inner_text().startswith("diverged at step")
    incident = page.locator("li.incident", has_text="grad_divergence").first
    assert incident.locator(".state").inner_text().lower() == "ended unresolved"
    assert "docs/alerts.md#" in incident.locator(".remedy").inner_text()
    page.goto(f"{stack.url}/")
    row = page.locator("table.runs tr", has=page.locator("a[href='/runs/live-run/']"))
    assert row.locator("td.verdict [data-verdict]").get_attribute("data-verdict") == "diverged"
    assert "critical" in row.locator("td.verdict").inner_text() and "in lockstep" not in row.inner_text()
    page.select_option("select[name=verdict]", "in_lockstep")
    page.click("#run-filters button[type=submit]")
    page.wait_for_load_state()
    assert "verdict=in_lockstep" in page.url and page.locator("a[href='/runs/live-run/']").count() == 0

    page.goto(f"{stack.url}/alerts/?run=live-run&state=all")  # every rank ended: the run's alerts resolved with it
    row = page.locator("tr.alert-row[data-kind=grad_divergence]")
    row.locator("button.ack").click()
    page.wait_for_load_state()
    assert "acked by ana" in page.locator("tr.alert-row[data-kind=grad_divergence]").inner_text()
    row = page.locator("tr.alert-row[data-kind=grad_divergence]")
    row.locator("details.silence summary").click()
    row.locator("textarea[name=comment]").fill("node 5 has a known bad GPU, swapping it tonight")
    row.locator("input[name=hours]").fill("4")
    row.locator(".silence-form button[type=submit]").click()
    page.wait_for_load_state()
    assert "Silence created." in page.content()
    assert "silenced until" in page.locator("tr.alert-row[data-kind=grad_divergence]").inner_text()
    assert "known bad GPU" in page.locator("table.silences").inner_text()
    shot(page, "alerts")

    page.goto(f"{stack.url}/runs/live-run/frame/?f={FRAMES[0]}")
    assert "size mismatch" in page.locator("table.reasons").inner_text()
    send_blobs(stack, token)
    page.goto(f"{stack.url}/runs/live-run/frame/?f=demo/ddp_job.py:77:head")
    assert "+    dropout = torch.nn.functional.dropout" in page.locator("pre.diff").inner_text()
    shot(page, "frame")


def test_compare_page_shows_the_torch_version_diff(stack, page, team):
    _, token, session = team
    send(
        stack,
        token,
        job_batches(
            Job("mlp-torch211", versions=dict(TORCH_211), fp_change_step=20, name="mlp torch 2.11", loss=False)
        ),
    )
    send(stack, token, job_batches(Job("mlp-torch213", recompile=(1, 3), name="mlp torch 2.13", loss=False)))
    login(page, stack, session)
    page.goto(f"{stack.url}/")
    shot(page, "runs")
    page.check("input[name=run][value=mlp-torch211]")
    page.check("input[name=run][value=mlp-torch213]")
    page.click("#compare-form button[type=submit]")
    page.wait_for_selector("#env")
    torch_row = page.locator("#env tr", has_text="versions.torch")
    assert (
        torch_row.is_visible() and "2.11.0+cu128" in torch_row.inner_text() and "2.13.0+cpu" in torch_row.inner_text()
    )
    same_row = page.locator("#env tr", has_text="env.OMP_NUM_THREADS")
    assert not same_row.is_visible()  # differences only by default
    page.uncheck("#diff-only")
    assert same_row.is_visible()
    page.check("#diff-only")
    deadline = time.monotonic() + 20  # the worker settles the grad slots; the page reads consensus
    while "first differing step 20" not in page.locator("ul.fingerprints").inner_text() and time.monotonic() < deadline:
        time.sleep(0.5)
        page.reload()
    assert "first differing step 20" in page.locator("ul.fingerprints").inner_text()
    page.wait_for_selector("#step-times canvas")
    shot(page, "compare")
    # neither run reported a loss: said in words, separated from the gradient norm, no empty chart
    assert "loss: no common steps; gradient norm: bitwise equal" in " ".join(
        page.locator("ul.drift").inner_text().split()
    )
    page.wait_for_selector("#drift-grad canvas")
    assert page.get_attribute("#drift-loss", "data-series") == "0"
    assert page.locator("#drift-loss canvas").count() == 0
    assert "none of these runs reported it" in page.locator("#drift-loss").inner_text()
    # the worse column names what got worse, the compile-time ratio beside it in words
    worse = page.locator("table.verdict-table tr", has_text="ddp_job.py:41").locator("td.worse-cell").inner_text()
    assert re.fullmatch(r"(nothing|[a-z ,]+) \(compile time ×[0-9.]+\)", worse), worse

    # a run without a baseline: the page asks for one (nothing unrelated preselected); chosen in the
    # browser, the run-wide divergence it finds is rooted in no rank and says so
    page.goto(f"{stack.url}/runs/mlp-torch211/")
    choice = page.locator("form.baseline select[name=baseline]")
    assert "Baseline: none" in page.locator("form.baseline").inner_text()
    assert choice.input_value() == "" and choice.locator("option:checked").inner_text() == "choose a run"
    choice.select_option("mlp-torch213")
    page.click("form.baseline button[type=submit]")
    page.wait_for_selector("form.baseline a:has-text('mlp-torch213')")
    wait_for_page_text(page, "li.incident[data-root-kind=baseline_divergence]")
    root = page.locator("li.incident[data-root-kind=baseline_divergence] .ranks").inner_text()
    assert root == "root: the whole run", root


def wait_for_page_text(page, selector: str, timeout: float = 30) -> str:
    """The text of `selector` once the stack's worker has put it on the page (reloading until then)."""
    deadline = time.monotonic() + timeout
    while not page.locator(selector).count():
        assert time.monotonic() < deadline, f"{selector} never appeared on {page.url}"
        time.sleep(0.5)
        page.reload()
    return page.locator(selector).first.inner_text()


def test_an_error_printed_for_a_terminal_reads_as_plain_words_on_the_run_page(stack, page, team):
    """Rank 0 crashes with an error a C++ logger wrote for a terminal (colour codes, a carriage return,
    a bell, a C1 control); rank 1 then gets gloo's "Connection closed by peer", which ends in a
    pictograph: the page shows the words, nothing a browser draws as an empty box."""
    _, token, session = team
    key = unique("gloo-tty")
    batches = job_batches(Job(key, world=2, steps=4, loss=False))
    gloo = (
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:23979. This is typically caused by a remote worker crashing. Check the logs of the "
        "remote worker before reporting an error. GLHF!"
    )
    reasons = [
        "\x1b[1;31mRuntimeError\x1b[0m: [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446] "
        "op.preamble.length <= op.nbytes. 8 vs 4\r\n\x07\x9b",
        f"RuntimeError: {gloo} \U0001f3d6\ufe0f",  # as a survivor's all_reduce raises it (torch 2.x)
    ]
    ends = [
        {"t": "rank_end", "status": "error", "exit_code": 1, "reason": reason, "exc_type": "RuntimeError"}
        for reason in reasons
    ]
    last = {b["rank"]: b for b in batches}
    send(stack, token, batches)
    send(
        stack,
        token,
        [{**last[r], "seq": last[r]["seq"] + 1, "events": [{**ends[r], "ts": time.time()}]} for r in range(2)],
    )
    login(page, stack, session)
    page.goto(f"{stack.url}/runs/{key}/")
    shown = wait_for_page_text(page, "li.incident[data-root-kind=rank_crashed] .message")
    assert shown.startswith(
        "Rank 0 crashed: RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446] "
        "op.preamble.length <= op.nbytes. 8 vs 4"
    ), shown
    page.click("li.incident[data-root-kind=rank_crashed] details.consequences summary")
    lost = page.locator("li.incident[data-root-kind=rank_crashed] li.consequence .message").inner_text()
    assert lost.startswith(f"Rank 1 crashed: RuntimeError: {gloo}"), lost
    text = page.locator("body").text_content() or ""
    odd = [c for c in text if c not in "\n\t" and (ord(c) < 32 or 0x7F <= ord(c) < 0xA0 or ord(c) > 0xFFFF)]
    assert not odd and "\ufffd" not in text and "\ufe0f" not in text, odd


def test_user_text_is_escaped_everywhere(stack, page, team):
    _, token, session = team
    job = Job(
        "xss-run",
        name=f"run {XSS}",
        recompile=(1, 2),
        recompile_reason=f"reason {XSS}",
        graph_frame=f"evil.py:1:{XSS}",
        steps=6,
    )
    graph_frame = f"evil.py:1:{XSS}"
    before, after = split(job_batches(job), lambda e: e["t"] == "compile" and e["frame"] == graph_frame)
    send(stack, token, before)
    login(page, stack, session)
    page.goto(f"{stack.url}/runs/xss-run/")
    page.wait_for_selector("#live-status[data-connected=true]", timeout=15_000)  # its ranks ended: "ended"
    send(stack, token, after)  # every rank reports the slot: it settles at once and the alert arrives live
    page.wait_for_selector("li.alert[data-kind=graph_divergence]", timeout=45_000)
    assert XSS in page.locator("li.alert[data-kind=graph_divergence]").inner_text()
    assert f"run {XSS}" in page.locator("h1").inner_text()
    page.goto(f"{stack.url}/runs/xss-run/frame/?f={FRAMES[0]}")
    assert f"reason {XSS}" in page.locator("table.reasons").inner_text()
    for url in (
        f"/runs/xss-run/frame/?f=evil.py:1:{XSS}",
        f"/runs/xss-run/frame/?f={FRAMES[0]}",
        "/",
        "/alerts/?state=all",
        "/runs/xss-run/ranks/1/",
    ):
        page.goto(stack.url + url)
        assert XSS in page.locator("main").inner_text(), url
        assert page.evaluate("window.pwned") is None, url


def test_other_projects_user_cannot_open_the_run(stack, page, team):
    _, token, _ = team
    send(stack, token, job_batches(Job("private-run", steps=3)))
    outsider = User.objects.create_user(unique("otto"), password="pw-otto-123")
    Project.objects.create(name=unique("speech")).members.add(outsider)
    page.context.clear_cookies()
    page.goto(f"{stack.url}/runs/private-run/")
    assert "/login/" in page.url  # login required
    page.fill("input[name=username]", outsider.username)
    page.fill("input[name=password]", "pw-otto-123")
    page.click("form.login button[type=submit]")
    page.wait_for_load_state()
    response = page.goto(f"{stack.url}/runs/private-run/")
    assert response.status == 404
    assert page.goto(f"{stack.url}/api/v1/runs/private-run/timeline").status == 404
    page.goto(f"{stack.url}/")
    assert "private-run" not in page.content()
