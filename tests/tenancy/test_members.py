"""`manage.py addmember`: a team's own runs become visible to its people without the admin, and
`createtoken` says who sees the project it made a token for."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from dashboard.tenancy.models import Project, Run

pytestmark = pytest.mark.django_db


def test_createtoken_says_nobody_sees_the_project_then_who_does(capsys):
    call_command("createtoken", "team-m")
    assert "no user sees its runs yet: manage.py addmember team-m USER" in capsys.readouterr().err
    call_command("addmember", "team-m", "bob", "--password-stdin", stdin=io.StringIO("pw-bob\n"))
    assert "bob is a member of team-m; its members: bob" in capsys.readouterr().out
    call_command("createtoken", "team-m")
    assert "its runs are visible to: bob (more: manage.py addmember team-m USER)" in capsys.readouterr().err


def test_a_member_added_from_the_command_line_sees_the_projects_runs():
    project = Project.objects.create(name="team-n")
    Run.objects.create(project=project, key="run-n", world_size=2)
    browser = Client()
    browser.force_login(User.objects.create_user("carol", password="pw-carol"))
    assert browser.get("/api/v1/runs/run-n").status_code == 404  # not a member yet: as if missing
    call_command("addmember", "team-n", "carol")
    assert browser.get("/api/v1/runs/run-n").json()["key"] == "run-n"


def test_addmember_refuses_what_it_cannot_do_and_changes_nothing():
    Project.objects.create(name="team-o")
    with pytest.raises(CommandError, match=r"no project 'nope' \(projects: team-o; createtoken makes one\)"):
        call_command("addmember", "nope", "dave")
    with pytest.raises(CommandError, match=r"no user 'dave': add --password-stdin to create one"):
        call_command("addmember", "team-o", "dave")
    with pytest.raises(CommandError, match="empty password"):
        call_command("addmember", "team-o", "dave", "--password-stdin", stdin=io.StringIO("\n"))
    assert not User.objects.filter(username="dave").exists()
    assert not Project.objects.get(name="team-o").members.exists()
