"""Durable, bounded on-disk spool: one file per batch holding the exact request body.

File names sort in upload order: `r<rank>-<session>-<seq>.json[.gz]`, zero-padded, so
a name sort is (rank, session, seq) order and each session's batches go out in seq order.
A batch the server proved malformed moves to `quarantine/` next to its answer (`<name>.answer`):
it never goes out again, and nothing is ever deleted unsent.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import os
import tempfile
import uuid
from collections.abc import Iterator

import msgspec

GZIP_MAGIC = b"\x1f\x8b"
GZIP_OVER = 1024  # smaller bodies go as they are: gzip would save little and cost a header
QUARANTINE = "quarantine"


def wire_body(raw: bytes) -> bytes:
    """A batch body as it is sent and spooled: gzip'd past GZIP_OVER bytes (the magic tells which)."""
    return gzip.compress(raw, 6) if len(raw) > GZIP_OVER else raw


def file_name(rank: int, session: str, seq: int, gzipped: bool) -> str:
    return f"r{rank:07d}-{session}-{seq:012d}.json" + (".gz" if gzipped else "")


def list_batches(directory: str) -> list[str]:
    """Spooled batch files in upload order (full paths)."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith("r") and n.endswith((".json", ".json.gz")))
    except OSError:
        return []
    return [os.path.join(directory, n) for n in names]


def split_body(body: bytes) -> list[tuple[str, bytes]] | None:
    """A batch body's events in two halves, each its own batch (seq 0 of a session derived from the
    original session, seq and half), as (file name, body); None when it holds fewer than 2 events.
    The derivation is deterministic, so a body split twice (a resend) yields the same batches and
    the server sees duplicates, not new data."""
    try:
        batch = msgspec.json.decode(gzip.decompress(body) if body[:2] == GZIP_MAGIC else body)
        events, session, seq, rank = batch["events"], batch["session"], batch["seq"], batch["rank"]
    except (msgspec.MsgspecError, OSError, EOFError, KeyError, TypeError, RecursionError):
        return None
    if not isinstance(events, list) or len(events) < 2:
        return None
    half = len(events) // 2
    out = []
    for i, part in enumerate((events[:half], events[half:])):
        derived = str(uuid.uuid5(uuid.NAMESPACE_URL, f"lockstep-split:{session}:{seq}:{i}"))
        body = wire_body(msgspec.json.encode({**batch, "session": derived, "seq": 0, "events": part}))
        out.append((file_name(rank, derived, 0, body[:2] == GZIP_MAGIC), body))
    return out


def used_bytes(directory: str) -> int:
    total = 0
    for path in list_batches(directory):
        try:
            total += os.path.getsize(path)
        except OSError:
            pass
    return total


class Spool:
    """Writes batches atomically, refusing past the byte cap; raises OSError on I/O failure.

    The cap is the folder's, not the process's: the ranks of a node share one spool folder by
    default, so the bytes in it are counted in `.usage` under an exclusive lock (`.usage.lock`)
    that every writer and remover of the folder takes. Each process recounts the folder once,
    on its first write, which also mends a count left wrong by a crash.
    """

    def __init__(self, directory: str, cap_bytes: int) -> None:
        self.directory = directory
        self.cap = cap_bytes
        self._recounted = False

    def write(self, name: str, body: bytes) -> str | None:
        """Path written, or None when the cap would be exceeded."""
        os.makedirs(self.directory, exist_ok=True)
        with self._usage() as usage:
            if usage[0] + len(body) > self.cap:
                return None
            path = os.path.join(self.directory, name)
            _write_atomically(self.directory, path, body)
            usage[0] += len(body)
        return path

    def quarantine(self, name: str, body: bytes, answer: str, spooled: str | None = None) -> str:
        """Keep a batch the server proved malformed, with its answer, out of the upload order;
        `spooled`: its file in the spool, moved rather than copied. Returns its new path."""
        folder = os.path.join(self.directory, QUARANTINE)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, name)
        if spooled is not None:
            with self._usage() as usage:
                os.replace(spooled, path)
                usage[0] = max(0, usage[0] - len(body))
        else:
            _write_atomically(folder, path, body)
        _write_atomically(folder, path + ".answer", answer.encode())
        return path

    def remove(self, path: str) -> None:
        try:
            with self._usage() as usage:
                size = os.path.getsize(path)
                os.unlink(path)
                usage[0] = max(0, usage[0] - size)
        except OSError:
            pass

    @contextlib.contextmanager
    def _usage(self) -> Iterator[list[int]]:
        """The folder's byte count as a one-item list, under the folder's lock; written back on exit."""
        with open(os.path.join(self.directory, ".usage.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            counter = os.path.join(self.directory, ".usage")
            try:
                with open(counter) as f:
                    counted = int(f.read() or 0)
            except (OSError, ValueError):
                counted = None
            if counted is None or not self._recounted:
                counted, self._recounted = used_bytes(self.directory), True
            usage = [counted]
            yield usage
            with open(counter + ".tmp", "w") as f:
                f.write(str(usage[0]))
            os.replace(counter + ".tmp", counter)


def _write_atomically(directory: str, path: str, body: bytes) -> None:
    """Write, fsync, rename: a crash leaves the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
