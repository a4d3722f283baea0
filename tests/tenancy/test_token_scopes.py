"""Token scopes: the agents' token (createtoken's default) ingests and reads but cannot clear the CI gate;
resolving and choosing a baseline take a token made with that scope, or a member's session. Through the
real door and the read API, on a real divergence."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from dashboard.detection import settle
from dashboard.detection.models import Alert, Baseline
from dashboard.ledger.models import GradSlot
from dashboard.tenancy.models import Project, ProjectToken
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


def createtoken(capsys, *args: str) -> str:
    call_command("createtoken", *args)
    return capsys.readouterr().out.strip().splitlines()[-1]


def bearer(token: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


@pytest.fixture
def agents_token(capsys) -> str:
    return createtoken(capsys, "team-s")


@pytest.fixture
def alert(client, agents_token) -> Alert:
    """Rank 2 diverged: one firing alert, sent with the agents' token."""
    for rank in range(3):
        events = [{"t": "grad", "step": 0, "fps": [7 if rank == 2 else 1]}]
        body = json.dumps(make_batch(run="r-scope", rank=rank, events=events))
        answer = client.post("/api/v1/ingest", body, content_type="application/json", **bearer(agents_token))
        assert answer.status_code == 200, answer.content
    settle.settle_grad(GradSlot.objects.get().id)
    return Alert.objects.get()


def _post(client: Client, path: str, body: dict, token: str):
    return client.post(path, json.dumps(body), content_type="application/json", **bearer(token))


def test_the_agents_token_ingests_and_reads_but_cannot_resolve_or_choose_a_baseline(client, agents_token, alert):
    assert ProjectToken.objects.get().scopes == ["ingest", "read"]
    [listed] = client.get("/api/v1/runs", **bearer(agents_token)).json()["runs"]
    assert listed["key"] == "r-scope" and listed["alerts"]["critical"] == 1
    assert client.get("/api/v1/runs/r-scope/alerts", **bearer(agents_token)).status_code == 200
    refused = _post(client, f"/api/v1/alerts/{alert.id}/resolve", {"reason": "green please"}, agents_token)
    assert refused.status_code == 403
    assert "lacks the 'resolve' scope" in refused.json()["error"] and "--scope resolve" in refused.json()["error"]
    chosen = _post(client, "/api/v1/runs/r-scope/baseline", {"baseline": "r-scope"}, agents_token)
    assert chosen.status_code == 403 and "lacks the 'baseline' scope" in chosen.json()["error"]
    assert _post(client, f"/api/v1/alerts/{alert.id}/ack", {}, agents_token).status_code == 403
    alert.refresh_from_db()
    assert alert.state == "firing" and alert.acked_at is None and not Baseline.objects.exists()


def test_a_token_made_with_the_resolve_scope_resolves_and_a_read_only_one_cannot_ingest(capsys, client, alert):
    resolver = createtoken(capsys, "team-s", "--scope", "read,resolve")
    assert ProjectToken.objects.get(digest=ProjectToken.digest_of(resolver)).scopes == ["read", "resolve"]
    answer = _post(client, f"/api/v1/alerts/{alert.id}/resolve", {"reason": "requeued"}, resolver)
    assert answer.status_code == 200 and answer.json()["state"] == "resolved"
    sent = _post(client, "/api/v1/ingest", make_batch(run="r-scope", rank=0, seq=9), resolver)
    assert sent.status_code == 403 and "lacks the 'ingest' scope" in sent.json()["error"]
    ingest_only = createtoken(capsys, "team-s", "--scope", "ingest")
    unread = client.get("/api/v1/runs", **bearer(ingest_only))
    assert unread.status_code == 403 and "lacks the 'read' scope" in unread.json()["error"]


def test_a_member_keeps_every_right_without_any_token(alert):
    user = User.objects.create_user("oncall", password="pw-oncall-123")
    Project.objects.get(name="team-s").members.add(user)
    browser = Client()
    browser.force_login(user)
    body = json.dumps({"reason": "node drained"})
    answer = browser.post(f"/api/v1/alerts/{alert.id}/resolve", body, content_type="application/json")
    assert answer.status_code == 200 and answer.json()["resolved_by"] == "oncall"


def test_createtoken_refuses_an_unknown_scope(capsys):
    with pytest.raises(CommandError, match="unknown scope admin"):
        call_command("createtoken", "team-s", "--scope", "read,admin")
    assert not ProjectToken.objects.exists()
