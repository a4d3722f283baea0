"""The compile bill end to end: a real 2-rank gloo torchrun job (demo/scenarios.py) where rank 1 alone
recompiles a helper every 2 steps (one more row each time, dynamic=False, 1 s per compile) while rank 0
waits at the next all-reduce. The project's own budget (2 % of the GPU time, from the
first second) makes `compile_cost` fire within seconds; the run page in Chromium shows the alert with
its remedy and the bill's recompile line with `torch._dynamo.mark_dynamic(x, 0)`, and so does
`lockstep cost RUN`."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dashboard.tenancy.models import Project, ProjectToken
from tests.browser import chromium_page
from tests.e2e.jobs import api, running, torchrun, wait_for_run
from tests.stack import ROOT, unique

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]
REMEDY = "torch._dynamo.mark_dynamic(x, 0)"


def wait_for_alert(stack, token: str, key: str, kind: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [a for a in api(stack, token, f"/runs/{key}/alerts").json()["alerts"] if a["kind"] == kind]
        if found:
            return found[0]
        time.sleep(0.5)
    raise AssertionError(f"no {kind} alert on {key}")


def test_budget_alert_and_remedy_on_the_run_page(stack, tmp_path):
    project = Project.objects.create(name=unique("bill"), compile_budget=0.02, compile_budget_after=0)
    token = ProjectToken.issue(project)
    user = User.objects.create_user(unique("bea"))
    project.members.add(user)
    client = Client()
    client.force_login(user)
    key = unique("recompiling")
    args = ["--steps", "8", "--recompile-rank", "1", "--recompile-every", "2", "--recompile-seconds", "1.0"]
    with running(torchrun(stack, token, key, "demo/scenarios.py", args, tmp_path / "spool", ranks=2)) as job:
        wait_for_run(stack, token, key, job)
        alert = wait_for_alert(stack, token, key, "compile_cost", timeout=60)
        line = wait_for_recompiles(stack, token, key, 3, job, timeout=90)
        check_pages(stack, token, key, alert, line, client.cookies["sessionid"].value)


def wait_for_recompiles(stack, token: str, key: str, n: int, job, timeout: float) -> dict:
    """The bill's recompile line once rank 1's n-th recompile (shapes 3, 4, 5 rows) is in."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [x for x in api(stack, token, f"/runs/{key}/cost").json()["lines"] if x["cause"] == "recompile"]
        if lines and lines[0]["compiles"] >= n:
            return lines[0]
        assert job.poll() in (None, 0)
        time.sleep(1)
    raise AssertionError(f"fewer than {n} recompiles billed on {key}")


def check_pages(stack, token: str, key: str, alert: dict, line: dict, session: str) -> None:
    assert alert["severity"] == "warning" and "Remedy: " in alert["message"] and alert["frame"]
    assert line["reason"] == "dimension 0 of x changes" and line["ranks"] == [1]
    assert line["remedy"].startswith(REMEDY)
    with chromium_page(stack.url, session) as page:
        page.goto(f"{stack.url}/runs/{key}/")
        shown = page.locator('li.alert[data-kind="compile_cost"] .message')
        assert "Remedy: " in shown.inner_text(timeout=10_000)
        page.wait_for_selector("#cost[data-loaded] table.cost-lines tr.recompile", timeout=15_000)
        row = page.locator("#cost table.cost-lines tr.recompile").first.inner_text()
        assert "dimension 0 of x changes" in row and REMEDY in row

    env = dict(os.environ, LOCKSTEP_URL=stack.url, LOCKSTEP_TOKEN=token)
    out = subprocess.run(
        [sys.executable, "-m", "lockstep_cli", "cost", key],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert "dimension 0 of x changes" in out.stdout and REMEDY in out.stdout
    assert "device-hours" in out.stdout  # gloo ranks on CPUs: their bill is no GPU time
