"""dashboard.devstack.processes: stopping children leaves nothing behind, even processes in sessions
of their own (as torchrun starts its ranks)."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

from dashboard.devstack.processes import descendants, kill_tree, stop_groups, survivors

SPAWNS_A_SESSION_LEADER = ("import subprocess, time\n"
                           "subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
                           "time.sleep(300)\n")


def _parent_with_a_detached_child() -> tuple[subprocess.Popen, int]:
    parent = subprocess.Popen([sys.executable, "-c", SPAWNS_A_SESSION_LEADER], start_new_session=True)
    deadline = time.monotonic() + 20
    while not (below := descendants(parent.pid)):
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    return parent, below[0]


def test_kill_tree_reaches_children_in_their_own_sessions():
    parent, child = _parent_with_a_detached_child()
    subprocess.run(["kill", "-STOP", str(child)], check=True)  # a frozen rank, as in the hung-rank tests
    kill_tree(parent)
    assert parent.returncode == -signal.SIGKILL and survivors([child]) == []


def test_stop_groups_terminates_then_kills_what_is_left():
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    stubborn, child = _parent_with_a_detached_child()
    subprocess.run(["kill", "-STOP", str(stubborn.pid)], check=True)  # cannot act on SIGTERM
    stop_groups([polite, stubborn], grace=1)
    assert polite.returncode == -signal.SIGTERM and stubborn.returncode == -signal.SIGKILL
    assert survivors([child]) == []
