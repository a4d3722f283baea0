"""Issue 51, item 3: the CLI follows no redirect, so neither its token nor its login goes to the
server a redirect names (was: a 302 or 307 to another port was followed, `Authorization` included)."""

from __future__ import annotations

import json

import pytest

from lockstep_cli import exits
from lockstep_cli.client import Client
from lockstep_cli.exits import CliError
from lockstep_cli.logins import Login
from tests.canned import Canned


@pytest.fixture
def elsewhere():
    """Another server, on another port, answering as the read API would."""
    server = Canned(200, {"Content-Type": "application/json"}, json.dumps({"runs": [], "ok": True}).encode())
    yield server
    server.close()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize(
    "ask",
    [
        pytest.param(lambda url: Client(url, "secret-token", None).get("/runs"), id="token"),
        pytest.param(
            lambda url: Client(url, None, Login("bob", "secret", "csrf")).post("/alerts/1/ack", {}), id="login"
        ),
    ],
)
def test_a_redirect_is_refused_and_the_credentials_stay_home(elsewhere, status, ask):
    target = elsewhere.url + "/api/v1/runs"
    redirect = Canned(status, {"Location": target})
    try:
        with pytest.raises(CliError) as refused:
            ask(redirect.url)
    finally:
        redirect.close()
    assert f"redirected to {target}" in str(refused.value) and refused.value.code == exits.SERVER
    assert len(redirect.requests) == 1 and elsewhere.requests == []  # nothing, let alone a credential, went there
