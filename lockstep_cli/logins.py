"""Logins kept between commands: the Django session a `lockstep login` got, per server URL.

Kept in `$XDG_CONFIG_HOME/lockstep/logins.json` (default ~/.config), mode 0600: it is as good as the
password until it expires or `lockstep logout` ends it on the server.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Login:
    user: str
    sessionid: str
    csrftoken: str

    def cookie_header(self) -> str:
        return f"sessionid={self.sessionid}; csrftoken={self.csrftoken}"


def path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "lockstep" / "logins.json"


def _read() -> dict[str, dict[str, Any]]:
    try:
        stored = json.loads(path().read_text())
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) else {}


def _write(logins: dict[str, dict[str, Any]]) -> None:
    target = path()
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with tempfile.NamedTemporaryFile("w", dir=target.parent, delete=False) as tmp:  # mode 0600
        json.dump(logins, tmp, indent=1, sort_keys=True)
    os.replace(tmp.name, target)


def load(url: str) -> Login | None:
    entry = _read().get(url)
    try:
        return Login(**entry) if isinstance(entry, dict) else None
    except TypeError:
        return None


def save(url: str, login: Login) -> None:
    _write({**_read(), url: asdict(login)})


def forget(url: str) -> bool:
    logins = _read()
    if logins.pop(url, None) is None:
        return False
    _write(logins)
    return True
