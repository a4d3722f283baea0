"""README command 1 itself, `scripts/up.sh` (the install, already done, then `manage.py up`), as a new
team runs it. Apart from test_up.py: nothing embedded starts here (the suite's DATABASE_URL and
REDIS_URL are kept), and its data folder is a plain temporary one, so it runs alongside other sessions."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile

import pytest

from tests.stack import ROOT

pytestmark = pytest.mark.e2e


def test_up_sh_on_a_taken_port_says_so_and_fails():
    """On a port another server holds: the cause on the terminal, no "Lockstep is up", a non-zero exit,
    and no second install (the development install holds the runtime one)."""
    with tempfile.TemporaryDirectory() as data, socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            ["scripts/up.sh", "--no-demo", "--port", str(port)],
            cwd=ROOT,
            env=dict(os.environ, LOCKSTEP_DATA_DIR=data),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode != 0, done.stdout + done.stderr
    assert "[bootstrap] installing" not in done.stdout
    assert "Lockstep is up" not in done.stdout
    assert f"127.0.0.1:{port} is taken (Address already in use)" in done.stderr
