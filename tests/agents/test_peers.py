"""The node's peers watched by their processes (agents/peers.py): real sibling processes, killed for real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from agents.peers import Peers

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="peers are watched through /proc (Linux)")


def rank(n: int, launch: str) -> subprocess.Popen:
    env = {**os.environ, "RANK": str(n), "TORCHELASTIC_RUN_ID": launch}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)


def test_a_killed_peer_is_reported_once_even_before_it_is_reaped(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "launch-a")
    ranks = {n: rank(n, "launch-a") for n in (1, 2)}
    other_launch = rank(3, "launch-b")
    try:
        peers = Peers(0, expected=2, parent=os.getpid())
        deadline = time.monotonic() + 10
        while len(peers.watched) < 2 and time.monotonic() < deadline:
            assert peers.gone() == []
            time.sleep(0.05)
        assert {r: p.pid for r, p in peers.watched.items()} == {1: ranks[1].pid, 2: ranks[2].pid}
        os.kill(ranks[2].pid, signal.SIGKILL)
        time.sleep(0.3)  # a zombie now: nobody has reaped it
        [gone] = peers.gone()
        assert (gone.rank, gone.pid) == (2, ranks[2].pid)
        assert peers.gone() == []  # told once
        ranks[2].wait()
        ranks[1].terminate()
        ranks[1].wait()
        assert [(e.rank, e.pid) for e in peers.gone()] == [(1, ranks[1].pid)]
    finally:
        for proc in (*ranks.values(), other_launch):
            proc.kill()
            proc.wait()
