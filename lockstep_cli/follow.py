"""`alerts RUN --follow`: the run's live feed (`ws/runs/<key>/`) as it happens.

The server takes websockets from logged-in users only (their session cookie), and checks the
Origin header against its allowed hosts, as for a browser on its pages.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from lockstep_cli import exits
from lockstep_cli.client import Client, path_of
from lockstep_cli.exits import CliError
from lockstep_cli.logins import Login
from lockstep_cli.tables import clean

POLL_S = 2.0


def wait_for_run(client: Client, key: str, wait_s: float) -> None:
    """Until its first batch arrives the server knows no such run (404): a follower started with the
    job waits for it, saying so once on stderr; after `wait_s` the 404 stands."""
    deadline = time.monotonic() + wait_s
    told = False
    while True:
        try:
            client.get(f"/runs/{path_of(key)}")
            return
        except CliError as err:
            if err.code != exits.NOT_FOUND:
                raise
            if time.monotonic() >= deadline:
                raise CliError(f"{err} (waited {wait_s:g} s, --wait)", exits.NOT_FOUND) from None
        if not told:
            print(
                f"lockstep: no run {clean(key)!r} yet; waiting up to {wait_s:g} s for its first batch (--wait)",
                file=sys.stderr,
                flush=True,
            )
            told = True
        time.sleep(max(0.0, min(POLL_S, deadline - time.monotonic())))


def can_follow(client: Client) -> Login:
    """The login a live feed takes; refuses --follow at once where it cannot work (called before any
    wait for the run, so a token-only user hears it now)."""
    try:
        import websockets.sync.client  # noqa: F401
    except ImportError:
        raise CliError(
            "--follow needs the websockets package: pip install 'lockstep-agent[cli]'", exits.USAGE
        ) from None
    if client.login is None:
        raise CliError(
            "--follow needs a login (live feeds take a user's session, not a project token): run `lockstep login`",
            exits.UNAUTHENTICATED,
        )
    return client.login


@contextmanager
def feed(client: Client, key: str, login: Login) -> Iterator[Callable[[], Iterator[dict[str, Any]]]]:
    """Open the run's feed with `login` (`can_follow`'s); yields a function iterating its alert messages
    until it closes."""
    from websockets.exceptions import ConnectionClosedOK, InvalidStatus, WebSocketException
    from websockets.sync.client import connect
    from websockets.typing import Origin

    url = client.url.replace("http", "ws", 1) + f"/ws/runs/{path_of(key)}/"
    try:
        ws = connect(
            url, origin=Origin(client.url), additional_headers={"Cookie": login.cookie_header()}, open_timeout=15
        )
    except InvalidStatus as err:
        client.get(f"/runs/{path_of(key)}")  # says why when it can: 404, 401 ...
        raise CliError(
            f"the server refused the live feed ({err.response.status_code}): following takes the session of a "
            f"member of the run's project (`lockstep login` as one; an admin adds members with "
            f"`python manage.py addmember PROJECT USER`)",
            exits.FORBIDDEN,
        ) from None
    except (WebSocketException, OSError, TimeoutError) as err:
        raise CliError(f"cannot open the live feed {url}: {err}", exits.UNREACHABLE) from None

    def messages() -> Iterator[dict[str, Any]]:
        try:
            for raw in ws:
                message = json.loads(raw)
                if message.get("type") == "alert":
                    yield message["alert"]
        except ConnectionClosedOK:
            pass
        except WebSocketException as err:
            code = getattr(getattr(err, "rcvd", None), "code", None)
            if code == 4403:
                raise CliError(
                    "the server closed the live feed: no longer allowed (logged out, or removed from the project)",
                    exits.FORBIDDEN,
                ) from None
            raise CliError(
                f"the live feed dropped: {clean(str(err))}", exits.UNREACHABLE
            ) from None  # a close reason is server text
        raise CliError("the server closed the live feed", exits.UNREACHABLE)

    with ws:
        yield messages
