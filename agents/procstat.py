"""One reader of /proc/<pid>/stat (Linux), for the agent's peer watch and run key, and for the
server's process handling (devstack, metrics folder, benches).

The command name (field 2) may hold spaces and parentheses, so fields are read after its last ")".
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

STATE, PPID, PGRP, UTIME, STIME, START = 0, 1, 2, 11, 12, 19  # indexes after the command name


def fields(pid: int, proc: str = "/proc") -> list[str] | None:
    """The stat fields after the command name (state first), or None when there is no such process."""
    try:
        with open(f"{proc}/{pid}/stat") as f:
            text = f.read()
        return text[text.rindex(")") + 2 :].split()
    except (OSError, ValueError):
        return None


def start_time(pid: int) -> str:
    """Start time in clock ticks since boot: with the pid, it tells a reused pid; '' when unknown."""
    found = fields(pid)
    return found[START] if found and len(found) > START else ""


def state(pid: int) -> str | None:
    """The process state letter ("R", "S", "Z", ...), or None when there is no such process."""
    found = fields(pid)
    return found[STATE] if found else None


def every(proc: str = "/proc") -> Iterator[tuple[int, list[str]]]:
    """(pid, fields) of every process."""
    for path in Path(proc).glob("[0-9]*/stat"):
        found = fields(int(path.parent.name), proc)
        if found:
            yield int(path.parent.name), found
