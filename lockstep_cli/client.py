"""HTTP to the read API (docs/design.md, Read API) with a project token or a login, and every failure as a CliError.

Reads go with the token when one is given (flag or LOCKSTEP_TOKEN), else with the login. Actions a
person takes (acknowledge, silence) go with the login when there is one: the server refuses them
to project tokens, which name a project, not a person.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from http.client import HTTPMessage
from http.cookiejar import CookieJar
from typing import IO, Any
from urllib.parse import quote, urlencode

from lockstep_cli import exits
from lockstep_cli.exits import CliError
from lockstep_cli.logins import Login

TIMEOUT_S = 30.0
NO_CREDENTIALS = "no credentials: pass --token (or set LOCKSTEP_TOKEN), or run `lockstep login`"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is the answer, never followed: a login answers 302 on success (the answer itself is
    what counts, not the page it points to), and no token or login may go where a redirect points."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> None:
        return None


class Client:
    def __init__(self, url: str, token: str | None, login: Login | None) -> None:
        self.url = url.rstrip("/")
        self.token = token or None
        self.login = login

    def get(self, path: str, **params: str) -> dict[str, Any]:
        query = f"?{urlencode(params)}" if params else ""
        return self._send("GET", f"/api/v1{path}{query}", None, self._reader_auth())

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._send("POST", f"/api/v1{path}", json.dumps(body).encode(), self._person_auth())

    def _reader_auth(self) -> dict[str, str]:
        if self.token:
            return {"Authorization": f"Bearer {self.token}"}
        if self.login:
            return {"Cookie": self.login.cookie_header()}
        return {}  # asked anyway: an unreachable server is told apart (3) from a refusal (4, NO_CREDENTIALS)

    def _person_auth(self) -> dict[str, str]:
        if self.login:
            return {"Cookie": self.login.cookie_header(), "X-CSRFToken": self.login.csrftoken}
        return self._reader_auth()

    def _send(self, method: str, path: str, body: bytes | None, auth: dict[str, str]) -> dict[str, Any]:
        headers = {"Accept": "application/json", "Referer": self.url + "/", **auth}
        if body is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.url + path, data=body, method=method, headers=headers)
        try:
            with urllib.request.build_opener(_NoRedirect()).open(request, timeout=TIMEOUT_S) as answer:
                return _json(answer.read(), path)
        except urllib.error.HTTPError as err:
            if 300 <= err.code < 400:
                raise self._redirected(err, path) from None
            if err.code == 401 and not auth:
                raise CliError(NO_CREDENTIALS, exits.UNAUTHENTICATED) from None
            raise _refusal(err, self.login is not None and "Cookie" in auth) from None
        except (urllib.error.URLError, OSError) as err:
            raise unreachable(self.url, err) from None

    def _redirected(self, err: urllib.error.HTTPError, path: str) -> CliError:
        return CliError(
            f"{path}: {err.code} redirected to {err.headers.get('Location', '?')}, not followed (credentials stay "
            f"with {self.url}; is that the server's own URL?)",
            exits.SERVER,
        )

    def sign_in(self, user: str, password: str) -> Login:
        """Django's login form, as a browser fills it in: its CSRF cookie first, then the form."""
        jar = CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), _NoRedirect())
        self._open(opener, urllib.request.Request(self.url + "/login/"))
        csrf = _cookie(jar, "csrftoken")
        if csrf is None:
            raise CliError(f"{self.url}/login/ set no CSRF cookie: is this a Lockstep server?", exits.SERVER)
        form = urlencode({"username": user, "password": password, "csrfmiddlewaretoken": csrf}).encode()
        self._open(
            opener, urllib.request.Request(self.url + "/login/", data=form, headers={"Referer": self.url + "/login/"})
        )
        session = _cookie(jar, "sessionid")
        if session is None:  # the form came back: Django answers a wrong password with the page again
            raise CliError(f"login as {user!r} failed: wrong user name or password", exits.UNAUTHENTICATED)
        return Login(user=user, sessionid=session, csrftoken=_cookie(jar, "csrftoken") or csrf)

    def sign_out(self) -> None:
        """End the session on the server too (Django logs out on POST)."""
        assert self.login is not None
        headers = {"Cookie": self.login.cookie_header(), "X-CSRFToken": self.login.csrftoken, "Referer": self.url + "/"}
        self._open(
            urllib.request.build_opener(_NoRedirect()),
            urllib.request.Request(self.url + "/logout/", data=b"", headers=headers),
        )

    def _open(self, opener: urllib.request.OpenerDirector, request: urllib.request.Request) -> int:
        """The answer's status, a redirect being an answer; a refusal or no answer as a CliError."""
        try:
            with opener.open(request, timeout=TIMEOUT_S) as answer:
                status: int = answer.status
                return status
        except urllib.error.HTTPError as err:
            if err.code in (301, 302, 303):
                return err.code
            raise _refusal(err, False) from None
        except (urllib.error.URLError, OSError) as err:
            raise unreachable(self.url, err) from None


def path_of(key: str) -> str:
    """A run key as one path segment."""
    return quote(key, safe="")


def unreachable(url: str, err: Exception) -> CliError:
    reason = getattr(err, "reason", err)
    if isinstance(reason, TimeoutError) or isinstance(err, TimeoutError):
        reason = f"no answer within {TIMEOUT_S:g} s"
    return CliError(f"cannot reach {url}: {reason}", exits.UNREACHABLE)


def _cookie(jar: CookieJar, name: str) -> str | None:
    return next((c.value for c in jar if c.name == name), None)


def _json(raw: bytes, path: str) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError:
        raise CliError(f"{path}: the answer is not JSON (a proxy in the way?)", exits.SERVER) from None
    if not isinstance(body, dict):
        raise CliError(f"{path}: unexpected answer {body!r:.200}", exits.SERVER)
    return body


def _refusal(err: urllib.error.HTTPError, by_login: bool) -> CliError:
    """The server's own words for a refusal, with the fix when it is about credentials."""
    try:
        body = json.loads(err.read() or b"{}")
    except (ValueError, OSError):
        body = {}
    message = body.get("error") if isinstance(body, dict) else None
    message = f"{err.code} {message or err.reason}"
    if isinstance(body, dict) and isinstance(body.get("fields"), dict):
        message += ": " + "; ".join(
            f"{field}: {' '.join(e.get('message', '') for e in errors)}" for field, errors in body["fields"].items()
        )
    if err.code == 401:
        message += (
            " (login expired: run `lockstep login`)"
            if by_login
            else " (check --token / LOCKSTEP_TOKEN, or run `lockstep login`)"
        )
    return CliError(message, exits.for_status(err.code))
