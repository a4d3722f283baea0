"""dashboard.devstack.processes: stopping children leaves nothing behind, even processes in sessions
of their own (as torchrun starts its ranks)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from dashboard.devstack.processes import descendants, group_members, kill_tree, stop_groups, survivors

SPAWNS_A_SESSION_LEADER = (
    "import subprocess, time\nsubprocess.Popen(['sleep', '300'], start_new_session=True)\ntime.sleep(300)\n"
)


def _parent_with_a_detached_child(deaf_to_sigterm: bool = False) -> tuple[subprocess.Popen, int]:
    """`deaf_to_sigterm`: the parent ignores SIGTERM (set before its child starts, so before this returns)."""
    deaf = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if deaf_to_sigterm else ""
    parent = subprocess.Popen([sys.executable, "-c", deaf + SPAWNS_A_SESSION_LEADER], start_new_session=True)
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
    # Ignores SIGTERM. (A SIGSTOPped process is no stand-in: a SIGTERM with its default action still
    # ended it in one clean-clone suite run here.)
    stubborn, child = _parent_with_a_detached_child(deaf_to_sigterm=True)
    stop_groups([polite, stubborn], grace=1)
    assert polite.returncode == -signal.SIGTERM and stubborn.returncode == -signal.SIGKILL
    assert survivors([child]) == []


def _ignores_sigterm(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    ignored = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
    return bool(ignored & (1 << (signal.SIGTERM - 1)))


def test_stop_groups_ends_a_group_whose_leader_went_first():
    """As a Celery worker's beat child could outlive its main process: the leader exits on SIGTERM,
    a child in its group ignores it."""
    deaf_child = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {deaf_child!r}])\ntime.sleep(300)",
        ],
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while not (children := [pid for pid in group_members(leader.pid) if pid != leader.pid and _ignores_sigterm(pid)]):
        assert time.monotonic() < deadline, "the child never ignored SIGTERM"
        time.sleep(0.05)
    [child] = children
    stop_groups([leader], grace=2)
    assert leader.returncode == -signal.SIGTERM
    assert survivors([child]) == [] and group_members(leader.pid) == []
