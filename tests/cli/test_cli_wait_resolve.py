"""The CLI before a job starts and after an alert went stale: `alerts RUN --follow` waits for a run
that has not sent its first batch; an unreachable server is exit 3 with or without credentials;
`resolve ID --reason` closes an alert with who and why. The real CLI as a subprocess against the stack."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import requests
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F

from dashboard.detection import lifecycle, settle
from dashboard.detection.models import Alert
from dashboard.ledger.models import GradSlot
from dashboard.tenancy.models import READ, RESOLVE, Project, ProjectToken, Run
from lockstep_cli import logins
from tests.conftest import make_batch
from tests.stack import ROOT, free_port, unique

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]
PASSWORD = "cli-wait-pw"


def _env(url: str, home, token: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in {"LOCKSTEP_TOKEN", "LOCKSTEP_URL"}}
    env.update(LOCKSTEP_URL=url, XDG_CONFIG_HOME=str(home / "config"), PYTHONPATH=str(ROOT))
    return {**env, "LOCKSTEP_TOKEN": token} if token else env


def lockstep(url: str, home, *args: str, token: str | None = None, stdin: str | None = None):
    return subprocess.run(
        [sys.executable, "-m", "lockstep_cli", *args],
        env=_env(url, home, token),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=home,
    )


def _post(url: str, token: str, body: dict) -> None:
    answer = requests.post(
        url + "/api/v1/ingest",
        data=gzip.compress(json.dumps(body).encode()),
        timeout=30,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert answer.status_code == 200, answer.text


@pytest.fixture
def team(tmp_path):
    project = Project.objects.create(name=unique("cli-wait"))
    user = User.objects.create_user(unique("bob"), password=PASSWORD)
    project.members.add(user)
    return project, ProjectToken.issue(project), user.username


def test_unreachable_is_exit_3_with_and_without_credentials(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    bare = lockstep(url, tmp_path, "runs")
    assert bare.returncode == 3 and "cannot reach" in bare.stderr, bare.stderr
    assert lockstep(url, tmp_path, "runs", token="lst_any").returncode == 3
    with pytest.MonkeyPatch.context() as env:  # a stored login for that server
        env.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
        logins.save(url, logins.Login(user="bob", sessionid="s", csrftoken="c"))
    assert lockstep(url, tmp_path, "alerts", "any-run", "--follow").returncode == 3
    assert lockstep(url, tmp_path, "resolve", "1", "--reason", "x").returncode == 3


def test_follow_waits_for_the_runs_first_batch(stack, team, tmp_path):
    project, token, user = team
    nothing = lockstep(stack.url, tmp_path, "runs")  # reachable, no credentials: the server's 401
    assert nothing.returncode == 4 and "no credentials" in nothing.stderr and "lockstep login" in nothing.stderr
    token_only = lockstep(stack.url, tmp_path, "alerts", unique("never"), "--follow", token=token)
    assert token_only.returncode == 4 and "needs a login" in token_only.stderr  # at once, not after --wait's 600 s
    assert (
        lockstep(stack.url, tmp_path, "login", "--user", user, "--password-stdin", stdin=PASSWORD + "\n").returncode
        == 0
    )
    gone = lockstep(stack.url, tmp_path, "alerts", unique("never"), "--follow", "--wait", "1")
    assert gone.returncode == 6 and "waited 1 s" in gone.stderr
    key = unique("late")
    follow = subprocess.Popen(
        [sys.executable, "-m", "lockstep_cli", "alerts", key, "--follow"],
        env=_env(stack.url, tmp_path),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        first = follow.stderr.readline()
        assert f"no run '{key}' yet; waiting up to 600 s" in first, first
        _post(stack.url, token, make_batch(run=key, rank=0, world_size=1))
        assert follow.stdout.readline()  # the table (no alerts yet) ...
        assert follow.stdout.readline().startswith(f"-- following {key}")  # ... then the live feed
        assert follow.poll() is None
    finally:
        os.killpg(follow.pid, signal.SIGTERM)
        follow.wait(timeout=30)


def test_resolve_by_hand_from_the_cli(stack, team, tmp_path):
    project, token, user = team
    key = unique("stale")
    for rank in range(3):
        _post(
            stack.url,
            token,
            make_batch(run=key, rank=rank, events=[{"t": "grad", "step": 0, "fps": [7 if rank == 2 else 1]}]),
        )
    deadline = time.monotonic() + 60
    while not (alert := Alert.objects.filter(run__key=key).first()) and time.monotonic() < deadline:
        time.sleep(0.5)  # the stack's worker settles the slot
    if alert is None:  # settled here when the worker is slow: the same code
        settle.settle_grad(GradSlot.objects.get(run__key=key).id)
        alert = Alert.objects.get(run__key=key)
    assert lockstep(stack.url, tmp_path, "resolve", str(alert.id)).returncode == 2  # --reason is required
    by_agents = lockstep(stack.url, tmp_path, "resolve", str(alert.id), "--reason", "requeued", token=token)
    assert by_agents.returncode != 0 and "this token lacks the 'resolve' scope" in by_agents.stderr, by_agents.stderr
    assert "createtoken <project> --scope resolve" in by_agents.stderr  # the agents' token cannot clear the gate
    resolver = ProjectToken.issue(project, (READ, RESOLVE))
    by_token = lockstep(stack.url, tmp_path, "resolve", str(alert.id), "--reason", "requeued", "--json", token=resolver)
    assert by_token.returncode == 0, by_token.stderr
    body = json.loads(by_token.stdout)
    assert body["state"] == "resolved" and body["resolved_by"] is None
    assert body["resolve_reason"] == f"resolved by hand: requeued (project token of {project.name})"
    alert.refresh_from_db()
    assert alert.state == "resolved" and alert.resolve_reason.startswith("resolved by hand: requeued")


def test_a_diverged_run_that_ended_keeps_its_verdict_in_runs_check_and_incidents(stack, team, tmp_path):
    """The run's end closes its incident as ended unresolved: `runs` still counts it and names the
    verdict, `check` still fails and says so, and both say what to do."""
    project, token, user = team
    key = unique("ended-div")
    for rank in range(3):
        events = [{"t": "grad", "step": 0, "fps": [7 if rank == 2 else 1]}, {"t": "rank_end", "status": "ok"}]
        _post(stack.url, token, make_batch(run=key, rank=rank, events=events))
    deadline = time.monotonic() + 60
    while not Alert.objects.filter(run__key=key).exists() and time.monotonic() < deadline:
        time.sleep(0.5)  # the stack's worker settles the slot
    if not Alert.objects.filter(run__key=key).exists():
        settle.settle_grad(GradSlot.objects.get(run__key=key).id)
    Alert.objects.filter(run__key=key).update(notified_revision=F("revision"))  # as delivery does
    with transaction.atomic():
        lifecycle.end_of_run(Run.objects.get(key=key))
    assert set(Alert.objects.filter(run__key=key).values_list("state", flat=True)) == {"ended_unresolved"}

    said = "diverged at step 0 (rank 2, grad_divergence)"
    header, *rows = lockstep(stack.url, tmp_path, "runs", token=token).stdout.splitlines()
    [row] = [line for line in rows if line.startswith(key)]
    critical = header.index("CRITICAL")
    assert row[critical:].split()[:2] == ["1", "0"] and row.endswith(said), row  # CRITICAL still counts it
    picked = lockstep(stack.url, tmp_path, "runs", "--verdict", "diverged", "--json", token=token)
    assert [r["key"] for r in json.loads(picked.stdout)["runs"]] == [key]
    assert json.loads(picked.stdout)["runs"][0]["verdict"]["kind"] == "diverged"
    clean = lockstep(stack.url, tmp_path, "runs", "--verdict", "in_lockstep", "--json", token=token)
    assert key not in clean.stdout

    check = lockstep(stack.url, tmp_path, "check", key, token=token)
    assert check.returncode == 1, check.stdout + check.stderr
    lines = check.stdout.splitlines()
    assert lines[0] == f"{key}: {said}" and "1 critical incident(s) unresolved" in lines[1]
    assert lines[3].split()[1:3] == ["ended", "unresolved"]  # not "resolved"
    assert lines[4].startswith("    what to do: ") and "(see docs/alerts.md#grad_divergence)" in lines[4]
    listed = lockstep(stack.url, tmp_path, "incidents", key, token=token).stdout
    assert "ended unresolved" in listed and "docs/alerts.md#grad_divergence" in listed
