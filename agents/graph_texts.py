"""Normalized graph texts of this process's compiles, kept for the server's `want_blobs` (docs/design.md).

A compile event carries only hashes. The server asks for a text it lacks (`want_blobs`), of one
rank only however many hold it, and that rank uploads it to `POST /api/v1/blobs`, where the hash
is verified; the frame page diffs these texts. Texts are kept newest-first within a byte budget:
one asked for after it was evicted, or longer than the server takes, is not sent.
"""

from __future__ import annotations

import gzip
import threading
from collections import OrderedDict

from agents import protocol

KEPT_CHARS = 64 << 20


class GraphTexts:
    """hash -> normalized text; written by the capture (training thread), read by the sender thread."""

    def __init__(self, budget: int = KEPT_CHARS) -> None:
        self._texts: OrderedDict[str, str] = OrderedDict()
        self._chars = 0
        self._budget = budget
        self._lock = threading.Lock()

    def keep(self, digest: str, text: str) -> None:
        if len(text) > protocol.MAX_BLOB_BYTES:  # the server refuses it: not worth the memory
            return
        with self._lock:
            if digest in self._texts:
                self._texts.move_to_end(digest)
                return
            self._texts[digest] = text
            self._chars += len(text)
            while self._chars > self._budget:
                _, old = self._texts.popitem(last=False)
                self._chars -= len(old)

    def bodies(self, hashes: list[str]) -> list[bytes]:
        """Gzipped `POST /api/v1/blobs` bodies with the asked texts this process holds, each well under the body limit."""
        with self._lock:
            found = [protocol.Blob(hash=h, text=self._texts[h]) for h in dict.fromkeys(hashes) if h in self._texts]
        groups: list[list[protocol.Blob]] = []
        size = 0
        for blob in found:
            if (
                not groups
                or size + len(blob.text) > protocol.MAX_BLOB_BYTES
                or len(groups[-1]) >= protocol.MAX_BLOBS_PER_UPLOAD
            ):
                groups.append([])
                size = 0
            groups[-1].append(blob)
            size += len(blob.text)
        return [
            gzip.compress(protocol.encode(protocol.BlobUpload(v=protocol.PROTOCOL_VERSION, blobs=group)), 6)
            for group in groups
        ]
