"""Issue 29, the rules that need no running server (Django's test client, the real views): silence
scope (8), login throttling per address (9; issue 51, item 11), the demo login (11), the one
visibility rule (12) and the Content-Security-Policy (13). The server-edge items are in test_edge.py."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dashboard.detection.models import Silence
from dashboard.devstack.management.commands.up import DEMO_PASSWORD, DEMO_USER, Command
from dashboard.tenancy.auth import user_project_ids
from dashboard.tenancy.models import Project, Run
from tests.stack import ROOT

pytestmark = pytest.mark.django_db


def _member(project: Project, name: str = "member") -> Client:
    user = User.objects.create_user(name, password="pw")
    project.members.add(user)
    client = Client()
    client.force_login(user)
    return client


# item 8 ------------------------------------------------------------------------------------------


def test_a_silence_naming_a_project_that_is_not_the_callers_is_a_404_never_a_fallback(project):
    theirs = Project.objects.create(name="someone-else")
    client = _member(project)
    answer = client.post(
        "/api/v1/silences",
        {"project": theirs.name, "hours": 1, "comment": "mute them"},
        content_type="application/json",
    )
    assert answer.status_code == 404 and "someone-else" in answer.json()["error"]
    missing = client.post(
        "/api/v1/silences", {"project": "no-such-project", "hours": 1, "comment": "x"}, content_type="application/json"
    )
    assert (missing.status_code, missing.json()["error"].replace("no-such-project", "someone-else")) == (
        404,
        answer.json()["error"],
    )  # exactly as for a project that does not exist
    assert not Silence.objects.exists()  # neither theirs nor the caller's own whole project
    own = client.post(
        "/api/v1/silences", {"project": project.name, "hours": 1, "comment": "ok"}, content_type="application/json"
    )
    assert own.status_code == 201 and Silence.objects.get().project_id == project.id


# item 9 ------------------------------------------------------------------------------------------


def test_wrong_passwords_lock_out_their_address_never_the_user_elsewhere(settings):
    """Counted per (user, address) and per address, never per user name alone (issue 51, item 11; was:
    wrong passwords from anywhere locked the user out from every address: knowing a name was enough)."""
    User.objects.create_user("target", password="right-password")
    User.objects.create_user("someone", password="their-password")
    for i in range(settings.AXES_FAILURE_LIMIT):
        Client(REMOTE_ADDR="203.0.113.9").post("/login/", {"username": "target", "password": f"guess-{i}"})
    guesser = Client(REMOTE_ADDR="203.0.113.9")
    assert guesser.post("/login/", {"username": "target", "password": "right-password"}).status_code == 429
    assert guesser.post("/login/", {"username": "someone", "password": "their-password"}).status_code == 429
    for i in range(settings.AXES_FAILURE_LIMIT):  # one wrong password from each of as many addresses
        Client(REMOTE_ADDR=f"198.51.100.{i}").post("/login/", {"username": "target", "password": f"guess-{i}"})
    elsewhere = Client(REMOTE_ADDR="192.0.2.7").post("/login/", {"username": "target", "password": "right-password"})
    assert elsewhere.status_code == 302


# item 11 -----------------------------------------------------------------------------------------


def _demo_works() -> bool:
    user = User.objects.filter(username=DEMO_USER).first()
    return user is not None and user.check_password(DEMO_PASSWORD)


def test_the_demo_login_exists_only_with_the_demo_on_a_loopback_address(settings):
    settings.LOCKSTEP_EMBEDDED = True  # the embedded database of a data folder, as `manage.py up` with no DATABASE_URL
    up = Command()
    up.say = lambda text: None
    up.logins("127.0.0.1", no_demo=True)
    assert not User.objects.filter(username=DEMO_USER).exists()  # --no-demo: none
    up.logins("0.0.0.0", no_demo=False)
    assert not User.objects.filter(username=DEMO_USER).exists()  # bound where others reach it: none
    up.logins("127.0.0.1", no_demo=False)
    demo = User.objects.get(username=DEMO_USER)
    assert _demo_works() and not demo.is_superuser and not demo.is_staff  # a member of the demo project, nothing more
    up.logins("192.0.2.10", no_demo=False)  # the same data folder, later bound to a public address
    assert not _demo_works()
    assert (
        Client().post("/login/", {"username": DEMO_USER, "password": DEMO_PASSWORD}).status_code == 200
    )  # the form again


# item 12 -----------------------------------------------------------------------------------------


def test_a_superuser_is_a_member_like_everyone(project):
    root = User.objects.create_superuser("root", password="pw")
    Run.objects.create(project=project, key="private-run", world_size=1)
    assert user_project_ids(root) == frozenset()
    client = Client()
    client.force_login(root)
    assert client.get("/api/v1/runs").json()["runs"] == []
    assert client.get("/runs/private-run/").status_code == 404
    project.members.add(root)
    assert [r["key"] for r in client.get("/api/v1/runs").json()["runs"]] == ["private-run"]


# item 13 -----------------------------------------------------------------------------------------


def test_every_page_has_a_policy_without_inline_script(project):
    client = _member(project)
    Run.objects.create(project=project, key="csp-run", world_size=1)
    for path in ("/login/", "/", "/alerts/", "/runs/csp-run/", "/compare/"):
        policy = client.get(path)["Content-Security-Policy"]
        directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
        assert directives["script-src"] == "'self'" and directives["default-src"] == "'self'", path
        assert directives["object-src"] == "'none'" and directives["frame-ancestors"] == "'none'"


INLINE = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*application/json)[^>]*>|\son[a-z]+\s*=|javascript:", re.I)


def test_no_template_carries_inline_script_or_event_handlers():
    """The policy forbids them, so a template that had one would break in the browser: none has."""
    found = [
        (path.name, m.group(0))
        for path in (ROOT / "templates").rglob("*.html")
        for m in INLINE.finditer(path.read_text())
    ]
    assert found == []
