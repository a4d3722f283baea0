"""Content-addressed graph texts: each normalized text is asked for, and stored, once.

A compile event names its artifacts' normalized hashes. The first batch that names a hash the
server lacks gets it in `want_blobs` and a lease (LOCKSTEP_BLOB_LEASE seconds) is recorded; the
other ranks holding the same text are not asked while the lease runs, so 1024 ranks upload one
copy. If the asked agent never uploads, the next batch after the lease expires is asked instead.

Only texts the server asked for are stored, and an upload's answer says only which of its texts
it stored, so a token learns nothing of what other projects' agents sent. Texts no compile event
has named for the raw retention period, and requests never answered for a day, are pruned.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection

from agents import protocol
from ingest.models import Blob
from ingest.validation import Rejection

BLOB = Blob._meta.db_table
NAMED_REFRESH = "1 hour"  # how stale `named_at` may get before a naming batch refreshes it (a write, a row lock)
PRUNE_CHUNK = 1000


def wanted(hashes: list[str]) -> list[str]:
    """Of these hashes, those this caller should upload now (absent, and no live lease elsewhere)."""
    if not hashes:
        return []
    with connection.cursor() as cur:
        cur.execute(
            f"""
            INSERT INTO {BLOB} AS b (hash, size, requested_at, named_at)
            SELECT h, 0, now(), now() FROM unnest(%(hashes)s::text[]) AS h ORDER BY h
            ON CONFLICT (hash) DO UPDATE SET
              requested_at = CASE WHEN b.text IS NULL AND b.requested_at < now() - make_interval(secs => %(lease)s)
                                  THEN now() ELSE b.requested_at END,
              named_at = now()
              WHERE (b.text IS NULL AND b.requested_at < now() - make_interval(secs => %(lease)s))
                 OR b.named_at IS NULL OR b.named_at < now() - interval '{NAMED_REFRESH}'
            RETURNING hash, requested_at = now() AND text IS NULL
            """,
            {"hashes": sorted(set(hashes)), "lease": settings.LOCKSTEP_BLOB_LEASE},
        )
        return sorted(row[0] for row in cur.fetchall() if row[1])


def verify(upload: protocol.BlobUpload) -> list[tuple[str, str]]:
    """Every blob's hash must be the hash of its text, and its UTF-8 size within MAX_BLOB_BYTES."""
    checked = []
    for i, blob in enumerate(upload.blobs):
        data = blob.text.encode("utf-8", "surrogatepass")
        if len(data) > protocol.MAX_BLOB_BYTES:
            raise Rejection(413, f"blob exceeds {protocol.MAX_BLOB_BYTES} bytes", f"blobs[{i}].text")
        if protocol.blob_hash(blob.text) != blob.hash:
            raise Rejection(400, "hash does not match the text (blake2b-128 of its UTF-8 bytes)", f"blobs[{i}].hash")
        checked.append((blob.hash, blob.text))
    return checked


def store(blobs: list[tuple[str, str]]) -> protocol.BlobReply:
    """Fill the texts the server asked for; any other text is ignored. `known`: the upload's other
    hashes, held already or never asked for (the answer does not say which)."""
    unique = dict(sorted(blobs))
    with connection.cursor() as cur:
        cur.execute(
            f"""
            UPDATE {BLOB} AS b SET text = u.t, size = octet_length(u.t), stored_at = now()
            FROM unnest(%s::text[], %s::text[]) AS u(h, t)
            WHERE b.hash = u.h AND b.text IS NULL
            RETURNING b.hash
            """,
            [list(unique), list(unique.values())],
        )
        stored = {row[0] for row in cur.fetchall()}
    return protocol.BlobReply(stored=sorted(stored), known=sorted(set(unique) - stored))


def prune(now: datetime, retention: timedelta) -> int:
    """Delete, in chunks (short statements, short locks), texts no compile event named within
    `retention` and requests nobody answered for a day; returns how many rows went."""
    removed = 0
    with connection.cursor() as cur:
        while True:
            cur.execute(
                f"""
                DELETE FROM {BLOB} WHERE hash IN (
                  SELECT hash FROM {BLOB}
                  WHERE (text IS NULL AND requested_at < %(now)s - interval '1 day')
                     OR COALESCE(named_at, stored_at, requested_at) < %(now)s - %(retention)s
                  LIMIT {PRUNE_CHUNK})
                """,
                {"now": now, "retention": retention},
            )
            removed += cur.rowcount
            if cur.rowcount < PRUNE_CHUNK:
                return removed
