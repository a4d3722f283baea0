"""Durable, bounded on-disk spool: one file per batch holding the exact request body.

File names sort in upload order: `r<rank>-<session>-<seq>.json[.gz]`, zero-padded, so
a name sort is (rank, session, seq) order and each session's batches go out in seq order.
"""
from __future__ import annotations

import os
import tempfile

GZIP_MAGIC = b"\x1f\x8b"


def file_name(rank: int, session: str, seq: int, gzipped: bool) -> str:
    return f"r{rank:07d}-{session}-{seq:012d}.json" + (".gz" if gzipped else "")


def list_batches(directory: str) -> list[str]:
    """Spooled batch files in upload order (full paths)."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith("r") and n.endswith((".json", ".json.gz")))
    except OSError:
        return []
    return [os.path.join(directory, n) for n in names]


def used_bytes(directory: str) -> int:
    total = 0
    for path in list_batches(directory):
        try:
            total += os.path.getsize(path)
        except OSError:
            pass
    return total


class Spool:
    """Writes batches atomically, refusing past the byte cap; raises OSError on I/O failure."""

    def __init__(self, directory: str, cap_bytes: int) -> None:
        self.directory = directory
        self.cap = cap_bytes
        self._used: int | None = None

    def write(self, name: str, body: bytes) -> str | None:
        """Path written, or None when the cap would be exceeded."""
        if self._used is None:
            os.makedirs(self.directory, exist_ok=True)
            self._used = used_bytes(self.directory)
        if self._used + len(body) > self.cap:
            return None
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            path = os.path.join(self.directory, name)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self._used += len(body)
        return path

    def remove(self, path: str) -> None:
        try:
            size = os.path.getsize(path)
            os.unlink(path)
            if self._used is not None:
                self._used = max(0, self._used - size)
        except OSError:
            pass
