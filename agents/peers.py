"""The other ranks of this node, watched by their processes: a peer that vanishes without a rank_end
(SIGKILL, the OOM killer, a crash in native code) says nothing itself, and its heartbeats take
`LOCKSTEP_SILENT_AFTER` to lapse; the ranks beside it see it go at once, as torchrun does, and
report it (`protocol.PeerGone`, docs/agent.md).

Linux only (/proc). The peers are the launcher's other children (torchrun's ranks of one node are
siblings) of the same launch (`TORCHELASTIC_RUN_ID`), each named by the RANK in its environment. A
process is gone when its /proc entry is, when it is a zombie (exited, not yet reaped by the
launcher), or when its pid now belongs to a process started later.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from agents import procstat, protocol

PROC = "/proc"
FIND_S = 60.0  # how long to look for siblings not found yet: a launcher starts a node's ranks together


@dataclass(frozen=True)
class Peer:
    rank: int
    pid: int
    started: str  # start time in clock ticks since boot (/proc/<pid>/stat field 22): tells a reused pid


def _stat(proc: str, pid: int) -> tuple[str, int, str] | None:
    """(state, parent pid, start time) of a process, or None when there is no such process."""
    fields = procstat.fields(pid, proc)
    return (fields[procstat.STATE], int(fields[procstat.PPID]), fields[procstat.START]) if fields else None


def _environ(proc: str, pid: int) -> dict[str, str]:
    try:
        with open(f"{proc}/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    pairs = (item.decode("utf-8", "replace").partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


class Peers:
    """`gone()`: the peers whose process vanished since the last look, each reported once. Looks for
    its siblings until it has found the `expected` ones, for at most FIND_S."""

    def __init__(self, rank: int, expected: int, parent: int | None = None, proc: str = PROC) -> None:
        self.rank = rank
        self.expected = expected
        self.parent = os.getppid() if parent is None else parent
        self.launch = os.environ.get("TORCHELASTIC_RUN_ID")
        self._proc = proc
        self.watched: dict[int, Peer] = {}  # rank -> its process
        self._find_until = time.monotonic() + FIND_S

    @classmethod
    def of_launch(cls, rank: int) -> Peers | None:
        """The watcher of a rank torchrun started (LOCAL_WORLD_SIZE ranks on this node), else None."""
        expected = int(os.environ.get("LOCAL_WORLD_SIZE") or 1) - 1
        if expected < 1 or not os.path.isdir(PROC):
            return None
        return cls(rank, expected)

    def gone(self) -> list[protocol.PeerGone]:
        if len(self.watched) < self.expected and time.monotonic() < self._find_until:
            self._find()
        vanished = [peer for peer in self.watched.values() if not self._alive(peer)]
        for peer in vanished:
            del self.watched[peer.rank]
        self.expected -= len(vanished)
        return [protocol.PeerGone(ts=time.time(), rank=peer.rank, pid=peer.pid) for peer in vanished]

    def _alive(self, peer: Peer) -> bool:
        stat = _stat(self._proc, peer.pid)
        return stat is not None and stat[0] not in "ZX" and stat[2] == peer.started

    def _find(self) -> None:
        for name in os.listdir(self._proc):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            stat = _stat(self._proc, int(name))
            if stat is None or stat[1] != self.parent or stat[0] in "ZX":
                continue
            env = _environ(self._proc, int(name))
            if env.get("RANK", "").isdigit() and env.get("TORCHELASTIC_RUN_ID") == self.launch:
                rank = int(env["RANK"])
                if rank != self.rank and rank not in self.watched:
                    self.watched[rank] = Peer(rank, int(name), stat[2])
