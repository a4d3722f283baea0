"""The `lockstep` command line as a person and a CI job use it: the real CLI as a subprocess against
the real stack (uvicorn + Celery worker), with real 2-rank torchrun jobs ingested through the agent.

One team (a project, its token, a user with a password). A clean 2-rank DDP job recorded on an H200
with torch 2.11 (`realism-ddp-compile-warm-private` of `tests/fixtures/realism_clean.tgz`, uploaded with
`python -m agents upload`) is the reference; in a live job rank 1 alone recompiles at step SHAPE_STEP (one extra row) while `lockstep alerts --follow`
watches it live: `check` goes from 0 to 1 with the incident rooted at the critical `recompile_divergence`
of rank 1 (it stays firing: no later compile of that frame comes out clean) and back to 0 once a person
acknowledges it (acking the root acks the incident).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass

import pytest
import requests
from django.contrib.auth.models import User

from dashboard.detection.models import Silence
from dashboard.tenancy.models import Project, ProjectToken
from tests.conftest import make_batch
from tests.e2e.jobs import api, finish, running, torchrun, wait_for_run
from tests.stack import ROOT, free_port, unique

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]

PASSWORD = "cli-test-pw"
REFERENCE = "realism-ddp-compile-warm-private"  # the recording's run key
FIXTURES = ROOT / "tests" / "fixtures"
# The odd batch comes well after the run appears (compiles first): the feed is open by then. The job
# runs until the live checks are done (its stop file), however slow the machine is that day.
STEPS, SHAPE_STEP = 400, 10


@dataclass
class Team:
    project: Project
    token: str
    user: str
    reference: str  # a clean, finished run


@pytest.fixture(scope="module")
def team(stack, django_db_blocker, tmp_path_factory) -> Team:
    with django_db_blocker.unblock():
        project = Project.objects.create(name=unique("cli"))
        token = ProjectToken.issue(project)
        user = User.objects.create_user(unique("alice"), password=PASSWORD)
        project.members.add(user)
    spool = tmp_path_factory.mktemp("ref-spool")
    with tarfile.open(FIXTURES / "realism_clean.tgz") as tar:
        tar.extractall(spool, [m for m in tar.getmembers() if m.name.startswith(REFERENCE + "/")], filter="data")
    uploaded = subprocess.run(
        [sys.executable, "-m", "agents", "upload", "--url", stack.url, "--token", token, str(spool / REFERENCE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert uploaded.returncode == 0, uploaded.stderr
    return Team(project, token, user.username, REFERENCE)


def lockstep(
    stack, home, *args: str, token: str | None = None, stdin: str | None = None, url: str | None = None
) -> subprocess.CompletedProcess:
    """`lockstep ARGS` as a user would run it: URL (and token, when given) from the environment."""
    return subprocess.run(
        [sys.executable, "-m", "lockstep_cli", *args],
        env=_env(stack, home, token, url),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=home,
    )


def _env(stack, home, token: str | None, url: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in {"LOCKSTEP_TOKEN", "LOCKSTEP_URL"}}
    env.update(LOCKSTEP_URL=url or stack.url, XDG_CONFIG_HOME=str(home / "config"), PYTHONPATH=str(ROOT))
    if token:
        env["LOCKSTEP_TOKEN"] = token
    return env


def _interactive_sigint() -> None:
    """Ctrl-C as a terminal's foreground command gets it: a suite started in the background (`&`, as CI
    may) hands its children SIGINT ignored, and Python then installs no KeyboardInterrupt for it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Follow:
    """`lockstep alerts RUN --follow` running, its stdout lines collected as they come."""

    def __init__(self, stack, home, key: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lockstep_cli", "alerts", key, "--follow"],
            env=_env(stack, home, None),
            cwd=home,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=_interactive_sigint,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, *words: str, after: int = 0, timeout: float = 180) -> int:
        """Index of the first line from `after` on that holds every word."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, line in enumerate(self.lines[after:], after):
                if all(w in line.split() for w in words):
                    return i
            assert self.proc.poll() is None, f"follow exited {self.proc.returncode}: {self.proc.stderr.read()}"
            time.sleep(0.2)
        raise AssertionError(f"no line with {words}: {self.lines}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.wait(timeout=30)


def test_follow_check_ack_silence_on_a_live_divergence(stack, team, tmp_path):
    home = tmp_path
    assert lockstep(stack, home, "check", team.reference, token=team.token).returncode == 0  # clean run: passes
    login = lockstep(stack, home, "login", "--user", team.user, "--password-stdin", stdin=PASSWORD + "\n")
    assert login.returncode == 0 and f"as {team.user}" in login.stdout, login.stderr
    assert oct((home / "config" / "lockstep" / "logins.json").stat().st_mode & 0o777) == "0o600"

    key = unique("cli-div")
    stop = tmp_path / "stop"
    args = ["--steps", str(STEPS), "--sleep", "0.5", "--shape-rank", "1", "--shape-step", str(SHAPE_STEP)]
    args += ["--stop-file", str(stop)]
    with running(torchrun(stack, team.token, key, "demo/ddp_job.py", args, tmp_path / "spool", ranks=2)) as job:
        wait_for_run(stack, team.token, key, job)
        follow = Follow(stack, home, key)
        try:
            start = follow.wait_line("--", "following", timeout=60)
            assert follow.lines[:start] == ["no alerts"]  # nothing yet: what comes next is live
            fired = follow.wait_line("recompile_divergence", "critical", "firing", after=start)
            assert follow.lines[fired].split()[4:6] == ["1", str(SHAPE_STEP)]  # RANKS, STEP

            failing = lockstep(stack, home, "check", key)
            assert failing.returncode == 1, failing.stdout + failing.stderr
            assert "1 critical incident(s) unresolved and unacknowledged" in failing.stdout
            assert f"{key}: diverged at step {SHAPE_STEP} (rank 1, recompile_divergence)" in failing.stdout
            as_json = json.loads(lockstep(stack, home, "check", key, "--json").stdout)
            assert as_json["ok"] is False and [i["root"]["kind"] for i in as_json["firing"]] == ["recompile_divergence"]
            assert as_json["firing"][0]["root"]["ranks"] == [1]
            listed = lockstep(stack, home, "incidents", key)
            # the recompile's incident; on a loaded machine rank 1's recompile can also hold rank 0 in the
            # all-reduce long enough for a hang_forecast of its own (a warning, resolved once it compiled)
            rows = [
                words[1:5] for words in map(str.split, listed.stdout.splitlines()[1:]) if words and words[0].isdigit()
            ]
            assert listed.returncode == 0 and ["firing", "critical", "recompile_divergence", "1"] in rows, listed.stdout
            assert all(row[2] in ("recompile_divergence", "hang_forecast") for row in rows), listed.stdout

            [alert] = [
                a
                for a in json.loads(lockstep(stack, home, "alerts", key, "--json").stdout)["alerts"]
                if a["kind"] == "recompile_divergence"
            ]
            acked = lockstep(stack, home, "ack", str(alert["id"]))
            assert acked.returncode == 0 and f"as {team.user}" in acked.stdout, acked.stderr
            follow.wait_line("recompile_divergence", team.user, after=fired + 1, timeout=30)  # the ack, live

            passing = lockstep(stack, home, "check", key)
            assert passing.returncode == 0 and "(1 acknowledged)" in passing.stdout, passing.stdout + passing.stderr
        finally:
            code = follow.stop()
            stop.touch()
        assert code == 130  # Ctrl-C, as for any shell command
        finish(job)

    made = lockstep(
        stack,
        home,
        "silence",
        "--run",
        key,
        "--kind",
        "recompile_divergence",
        "--hours",
        "1",
        "--comment",
        "rank 1 recompiles on purpose",
        "--json",
    )
    assert made.returncode == 0, made.stderr
    silence = json.loads(made.stdout)
    assert (silence["run"], silence["kind"], silence["author"]) == (key, "recompile_divergence", team.user)
    assert Silence.objects.filter(id=silence["id"], run__key=key, comment="rank 1 recompiles on purpose").exists()

    out = lockstep(stack, home, "logout")
    assert out.returncode == 0 and "logged out" in out.stdout
    gone = lockstep(stack, home, "alerts", key, "--follow")
    assert gone.returncode == 4 and "lockstep login" in gone.stderr


def test_runs_alerts_and_compare_tables_and_json(stack, team, tmp_path):
    other = unique("cli-posted")
    for rank in (0, 1):  # a second run through the real ingest endpoint, as an agent posts it
        batch = make_batch(
            run=other, rank=rank, world_size=2, events=[{"t": "grad", "step": s, "fps": [s + 1, 7]} for s in range(3)]
        )
        assert (
            requests.post(
                f"{stack.url}/api/v1/ingest", json=batch, timeout=10, headers={"Authorization": f"Bearer {team.token}"}
            ).status_code
            == 200
        )

    listed = same_as_api(
        stack, team.token, "/runs", lambda: lockstep(stack, tmp_path, "runs", "--json", token=team.token)
    )
    keys = [r["key"] for r in listed["runs"]]
    assert team.reference in keys and other in keys
    table = lockstep(stack, tmp_path, "runs", token=team.token).stdout.splitlines()
    assert table[0].split()[:3] == ["RUN", "PROJECT", "STATUS"]
    [ref_row] = [line.split() for line in table if line.split()[0] == team.reference]
    assert ref_row[1:5] == [team.project.name, "finished", "2", "2.11.0+cu130"]

    alerts = lockstep(stack, tmp_path, "alerts", team.reference, "--json", token=team.token)
    assert json.loads(alerts.stdout) == {
        "alerts": api(stack, team.token, f"/runs/{team.reference}/alerts").json()["alerts"]
    }
    assert lockstep(stack, tmp_path, "alerts", team.reference, token=team.token).stdout.strip() == "no alerts"

    bill = json.loads(lockstep(stack, tmp_path, "cost", team.reference, "--json", token=team.token).stdout)
    assert bill == api(stack, team.token, f"/runs/{team.reference}/cost").json() and bill["gpu_seconds"] > 0
    text = lockstep(stack, tmp_path, "cost", team.reference, token=team.token).stdout
    assert bill["device"] == "GPU"  # every rank of the H200 recording said cuda
    assert text.startswith(f"{team.reference}: compilation cost {bill['gpu_seconds'] / 3600:.3f} GPU-hours"), text
    assert bill["lines"][0]["label"] in text and bill["lines"][0]["remedy"][:40] in text

    compared = lockstep(stack, tmp_path, "compare", team.reference, other, "--json", token=team.token)
    assert json.loads(compared.stdout) == api(stack, team.token, f"/compare?runs={team.reference},{other}").json()
    text = lockstep(stack, tmp_path, "compare", team.reference, other, token=team.token).stdout
    assert "compile summary (per rank)" in text and f"{team.reference} vs {other}" in text
    assert "environment:" in text and "frames:" in text


def same_as_api(stack, token: str, path: str, cli) -> dict:
    """The CLI's JSON, checked equal to the API's answer read just before and after it: the earlier test's
    run may still be settling (an alert resolving once its ranks ended), so a moving answer is read again."""
    for _ in range(10):
        before = api(stack, token, path).json()
        out = cli()
        after = api(stack, token, path).json()
        if before == after:
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout) == after
            return after
        time.sleep(1)
    raise AssertionError(f"{path} never held still for one CLI call")


def test_failures_have_distinct_exit_codes_and_change_nothing(stack, team, tmp_path):
    home = tmp_path
    unreachable = lockstep(stack, home, "runs", token=team.token, url=f"http://127.0.0.1:{free_port()}")
    assert unreachable.returncode == 3 and "cannot reach" in unreachable.stderr
    assert lockstep(stack, home, "runs", token="lst_not-a-token").returncode == 4
    nothing = lockstep(stack, home, "runs")
    assert nothing.returncode == 4 and "lockstep login" in nothing.stderr
    assert (
        subprocess.run(
            [sys.executable, "-m", "lockstep_cli", "runs"],
            capture_output=True,
            timeout=60,
            env={**_env(stack, home, team.token), "LOCKSTEP_URL": ""},
        ).returncode
        == 2
    )

    bogus = lockstep(stack, home, "runs", "--status", "bogus", token=team.token)
    assert bogus.returncode == 7 and "unknown status 'bogus'" in bogus.stderr
    missing = lockstep(stack, home, "check", unique("no-such-run"), token=team.token)
    assert missing.returncode == 6 and "404" in missing.stderr
    outsider_token = ProjectToken.issue(Project.objects.create(name=unique("other")))
    hidden = lockstep(stack, home, "alerts", team.reference, token=outsider_token)  # another project's run
    assert hidden.returncode == 6 and "404" in hidden.stderr

    by_token = lockstep(stack, home, "ack", "1", token=team.token)
    assert by_token.returncode == 5 and "user session" in by_token.stderr

    wrong = lockstep(stack, home, "login", "--user", team.user, "--password-stdin", stdin="wrong\n")
    assert wrong.returncode == 4 and "wrong user name or password" in wrong.stderr
    assert not (home / "config" / "lockstep" / "logins.json").exists()

    assert (
        lockstep(stack, home, "login", "--user", team.user, "--password-stdin", stdin=PASSWORD + "\n").returncode == 0
    )
    assert lockstep(stack, home, "ack", "999999999").returncode == 6
    before = Silence.objects.count()
    refused = lockstep(stack, home, "silence", "--run", team.reference, "--hours", "100000", "--comment", "too long")
    assert refused.returncode == 7 and "hours" in refused.stderr
    assert Silence.objects.count() == before


def test_follow_refused_to_a_non_member_says_why(stack, team, tmp_path):
    """The project's token reads the run, but the live feed takes a member's session: a logged-in user
    of no part in the project hears what following needs, not a bare 403."""
    with_token_only = User.objects.create_user(unique("outsider"), password=PASSWORD)
    login = lockstep(
        stack, tmp_path, "login", "--user", with_token_only.username, "--password-stdin", stdin=PASSWORD + "\n"
    )
    assert login.returncode == 0, login.stderr
    refused = lockstep(stack, tmp_path, "alerts", team.reference, "--follow", token=team.token)
    assert refused.returncode == 5, refused.stderr
    assert "refused the live feed (403): following takes the session of a member of the run's project" in refused.stderr
    assert "manage.py addmember PROJECT USER" in refused.stderr
