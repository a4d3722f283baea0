"""Pages and websockets require a session, and show only the user's projects."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from dashboard.tenancy.models import Project, ProjectToken, Run
from tests.conftest import make_batch


@pytest.fixture
def run_of(post):
    assert post(make_batch(run="page-run")).status_code == 200
    return Run.objects.get(key="page-run")


@pytest.mark.django_db
def test_pages_redirect_anonymous_users_to_login(client, run_of):
    for url in ("/", "/runs/page-run/"):
        response = client.get(url)
        assert response.status_code == 302 and response.url.startswith("/login/")


@pytest.mark.django_db
def test_member_sees_the_run_and_outsider_does_not(client, project, run_of):
    member = User.objects.create_user("mia")
    project.members.add(member)
    client.force_login(member)
    assert b"page-run" in client.get("/").content
    assert client.get("/runs/page-run/").status_code == 200
    client.force_login(User.objects.create_user("oscar"))
    assert b"page-run" not in client.get("/").content
    assert client.get("/runs/page-run/").status_code == 404


@pytest.mark.django_db
def test_createtoken_prints_a_working_token_last(capsys, client):
    call_command("createtoken", "team-x")
    token = capsys.readouterr().out.strip().splitlines()[-1]
    assert Project.objects.filter(name="team-x").exists()
    assert ProjectToken.objects.get(digest=ProjectToken.digest_of(token)).project.name == "team-x"
    assert client.get("/api/v1/runs", HTTP_AUTHORIZATION=f"Bearer {token}").json() == {"runs": []}


@pytest.mark.django_db
def test_createtoken_rejects_a_bad_project_name():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="letters, digits"):
        call_command("createtoken", "no spaces please")
    assert not Project.objects.exists()
