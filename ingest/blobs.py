"""Content-addressed graph texts: each normalized text is asked for, and stored, once.

A compile event names its artifacts' normalized hashes. The first batch that names a hash the
server lacks gets it in `want_blobs` and a lease (LOCKSTEP_BLOB_LEASE seconds) is recorded; the
other ranks holding the same text are not asked while the lease runs, so 1024 ranks upload one
copy. If the asked agent never uploads, the next batch after the lease expires is asked instead.
"""
from __future__ import annotations

from django.conf import settings
from django.db import connection

from agents import protocol
from ingest.validation import Rejection


def wanted(hashes: list[str]) -> list[str]:
    """Of these hashes, those this caller should upload now (absent, and no live lease elsewhere)."""
    if not hashes:
        return []
    with connection.cursor() as cur:
        cur.execute(
            """
            INSERT INTO ingest_blob (hash, size, requested_at)
            SELECT h, 0, now() FROM unnest(%s::text[]) AS h ORDER BY h
            ON CONFLICT (hash) DO UPDATE SET requested_at = now()
              WHERE ingest_blob.text IS NULL AND ingest_blob.requested_at < now() - make_interval(secs => %s)
            RETURNING hash
            """,
            [sorted(set(hashes)), settings.LOCKSTEP_BLOB_LEASE],
        )
        return sorted(row[0] for row in cur.fetchall())


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
    """Insert new texts; a text already held is left as it is (content-addressed: it is the same)."""
    unique = dict(blobs)
    with connection.cursor() as cur:
        cur.execute(
            """
            INSERT INTO ingest_blob (hash, text, size, stored_at)
            SELECT h, t, octet_length(t), now() FROM unnest(%s::text[], %s::text[]) AS b(h, t) ORDER BY h
            ON CONFLICT (hash) DO UPDATE SET text = EXCLUDED.text, size = EXCLUDED.size, stored_at = now()
              WHERE ingest_blob.text IS NULL
            RETURNING hash
            """,
            [list(unique), list(unique.values())],
        )
        stored = {row[0] for row in cur.fetchall()}
    return protocol.BlobReply(stored=sorted(stored), known=sorted(set(unique) - stored))
