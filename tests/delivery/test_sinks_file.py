"""Destinations as code: `manage.py sinks apply FILE` (TOML, secrets from the environment) is
idempotent, says what it created, updated, left and removed, checks every destination as the admin
does before storing any, and `sinks export` prints them back without a secret in a form apply takes."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from dashboard.delivery import sinks_file
from dashboard.delivery.models import Webhook
from dashboard.tenancy.models import Project

pytestmark = pytest.mark.django_db
ROUTING_KEY = "R0UT1NGKEY0123456789abcdefABCDEF"

FILE = """
[[destination]]
project = "{project}"
kind = "alertmanager"
url = "http://127.0.0.1:9093"

[[destination]]
project = "{project}"
kind = "pagerduty"
secret = "${{PD_KEY}}"

[[destination]]
project = "{project}"
kind = "slack"
url = "${{SLACK_URL}}"
active = false
"""


@pytest.fixture(autouse=True)
def private_receivers_allowed(settings):
    settings.LOCKSTEP_SINKS_ALLOW_PRIVATE = True  # the destinations here are on 127.0.0.1


@pytest.fixture
def team_file(project, tmp_path, monkeypatch):
    monkeypatch.setenv("PD_KEY", ROUTING_KEY)
    monkeypatch.setenv("SLACK_URL", "http://127.0.0.1:8125/services/T0/B0/XYZSECRET")
    path = tmp_path / "sinks.toml"
    path.write_text(FILE.format(project=project.name))
    return path


def sinks(*args: str) -> list[str]:
    out = io.StringIO()
    call_command("sinks", *args, stdout=out)
    return out.getvalue().splitlines()


def test_apply_is_idempotent_and_says_what_changed(project, team_file, monkeypatch):
    first = sinks("apply", str(team_file))
    assert first[-1] == "3 created, 0 updated, 0 unchanged, 0 removed"
    assert [line.split()[0] for line in first[:-1]] == ["created"] * 3
    assert "XYZSECRET" not in "\n".join(first) and ROUTING_KEY not in "\n".join(first)  # never printed
    stored = {h.kind: h for h in Webhook.objects.filter(project=project)}
    assert stored["pagerduty"].secret == ROUTING_KEY and stored["pagerduty"].url == ""
    assert stored["slack"].url.endswith("XYZSECRET") and not stored["slack"].active

    assert sinks("apply", str(team_file))[-1] == "0 created, 0 updated, 3 unchanged, 0 removed"
    assert Webhook.objects.filter(project=project).count() == 3

    monkeypatch.setenv("PD_KEY", ROUTING_KEY[::-1])  # the key was rotated
    assert sinks("apply", str(team_file))[-1] == "0 created, 1 updated, 2 unchanged, 0 removed"
    assert Webhook.objects.get(project=project, kind="pagerduty").secret == ROUTING_KEY[::-1]


def test_prune_removes_only_the_listed_projects_unlisted_destinations(project, team_file):
    by_hand = Webhook.objects.create(project=project, kind="json", url="http://127.0.0.1:9000/hook")
    other = Webhook.objects.create(
        project=Project.objects.create(name="other-team"), kind="json", url="http://127.0.0.1:9000/hook"
    )
    assert sinks("apply", str(team_file))[-1] == "3 created, 0 updated, 0 unchanged, 0 removed"  # no prune: kept
    assert Webhook.objects.filter(id=by_hand.id).exists()
    dry = sinks("apply", str(team_file), "--prune", "--dry-run")
    assert dry[-1] == "0 created, 0 updated, 3 unchanged, 1 removed (dry run: nothing stored)"
    assert Webhook.objects.filter(id=by_hand.id).exists()
    pruned = sinks("apply", str(team_file), "--prune")
    assert pruned[-2] == f"removed   {project.name}  json  http://127.0.0.1:9000/…" and pruned[-1].endswith("1 removed")
    assert not Webhook.objects.filter(id=by_hand.id).exists() and Webhook.objects.filter(id=other.id).exists()


def test_export_shows_no_secret_and_applies_back_unchanged(project, team_file, monkeypatch, tmp_path):
    sinks("apply", str(team_file))
    text = "\n".join(sinks("export", "--project", project.name))
    assert ROUTING_KEY not in text and "XYZSECRET" not in text
    hooks = {h.kind: h for h in Webhook.objects.filter(project=project)}
    assert f'secret = "${{SINK_SECRET_{hooks["pagerduty"].id}}}"' in text
    assert f'url = "${{SINK_URL_{hooks["slack"].id}}}"' in text and "active = false" in text
    monkeypatch.setenv(f"SINK_SECRET_{hooks['pagerduty'].id}", ROUTING_KEY)
    monkeypatch.setenv(f"SINK_URL_{hooks['slack'].id}", hooks["slack"].url)
    exported = tmp_path / "exported.toml"
    exported.write_text(text)
    assert sinks("apply", str(exported), "--prune")[-1] == "0 created, 0 updated, 3 unchanged, 0 removed"


def test_a_missing_variable_or_an_invalid_destination_stores_nothing(project, team_file, monkeypatch, tmp_path):
    monkeypatch.delenv("PD_KEY")
    with pytest.raises(CommandError, match=r"pagerduty\) secret: environment variable PD_KEY is not set"):
        sinks("apply", str(team_file))
    assert not Webhook.objects.exists()
    bad = tmp_path / "bad.toml"
    bad.write_text(
        f'[[destination]]\nproject = "{project.name}"\nkind = "json"\nurl = "http://127.0.0.1:1/a"\n\n'
        f'[[destination]]\nproject = "{project.name}"\nkind = "slack"\nurl = "http://127.0.0.1:2/b"\n'
        'secret = "nope"\n'
    )
    with pytest.raises(
        CommandError, match=r"destination 2 \(.*, slack\): secret: a Slack-compatible webhook takes no secret"
    ):
        sinks("apply", str(bad))
    assert not Webhook.objects.exists()  # the valid first one was not kept either
    with pytest.raises(CommandError, match="no such project"):
        sinks_apply_text(tmp_path, '[[destination]]\nproject = "nobody"\nkind = "json"\nurl = "http://127.0.0.1:1/a"\n')


def sinks_apply_text(tmp_path, text: str) -> list[str]:
    path = tmp_path / "one.toml"
    path.write_text(text)
    return sinks("apply", str(path))


def test_a_private_address_is_refused_as_the_admin_refuses_it(project, settings):
    settings.LOCKSTEP_SINKS_ALLOW_PRIVATE = False
    entries = sinks_file.parse(
        f'[[destination]]\nproject = "{project.name}"\nkind = "alertmanager"\nurl = "http://127.0.0.1:9093"\n', {}
    )
    with pytest.raises(sinks_file.SinksFileError, match="url: .*non-public address"):
        sinks_file.apply(entries)
