"""Content-addressed graph texts: each normalized text is asked for, and stored, once per project.

A compile event names its artifacts' normalized hashes. The first batch that names a hash its
project lacks gets it in `want_blobs` and a lease (LOCKSTEP_BLOB_LEASE seconds) is recorded; the
project's other ranks holding the same text are not asked while the lease runs, so 1024 ranks upload
one copy. If the asked agent never uploads, the next batch after the lease expires is asked instead.

Only texts the project was asked for are stored, and an upload's answer says only which of its texts
it stored. Another project's texts count for nothing: a text it stored is still asked of this
project's agents, so a token learns nothing of what other projects' agents sent. Texts no compile event
has named for the raw retention period, and requests never answered for a day, are pruned
(`dashboard.evidence.blobs`, which holds the table's statements; this module is the policy).

Bounded per project: the bytes its uploads stored, texts and Flight Recorder dumps alike, in all
(LOCKSTEP_BLOB_QUOTA) and within a day (LOCKSTEP_BLOB_QUOTA_DAY; `ingest.quotas`), and the texts
asked of each run (LOCKSTEP_BLOB_ASKS_PER_RUN). Past a
bound the server asks that project for nothing more, and refuses an upload that would cross
one (507 for the total, 429 for the day): a text not stored is only missing from a diff, so its
agent drops it. A token that names texts without end can fill neither the table nor the disk.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from agents import protocol
from dashboard.evidence import blobs as table
from ingest import quotas
from ingest.refusals import Refusal


def wanted(named: dict[tuple[int, int], list[str]]) -> set[str]:
    """Of the hashes each (project id, run id) named, those its agents should upload now (absent, no
    live lease elsewhere, and within the project's quotas and the run's asks); every named hash
    counts as named (retention) either way."""
    asked: set[str] = set()
    for (project_id, run_id), hashes in sorted(named.items()):
        hashes = sorted(set(hashes))
        budget = _asks_left(project_id, run_id)
        asked.update(table.ask(hashes[:budget], project_id, run_id, settings.LOCKSTEP_BLOB_LEASE))
        table.name(hashes[budget:], project_id)
    return asked


def _asks_left(project_id: int, run_id: int) -> int:
    """How many texts this run may still be asked for: none once its project is past a quota."""
    if quotas.bytes_full(project_id):
        return 0
    return max(0, settings.LOCKSTEP_BLOB_ASKS_PER_RUN - table.asked(run_id))


def verify(upload: protocol.BlobUpload) -> list[tuple[str, str]]:
    """Every blob's hash must be the hash of its text, and its UTF-8 size within MAX_BLOB_BYTES."""
    checked = []
    for i, blob in enumerate(upload.blobs):
        data = blob.text.encode("utf-8", "surrogatepass")
        if len(data) > protocol.MAX_BLOB_BYTES:
            raise Refusal(413, f"blob exceeds {protocol.MAX_BLOB_BYTES} bytes", f"blobs[{i}].text")
        if protocol.blob_hash(blob.text) != blob.hash:
            raise Refusal(400, "hash does not match the text (blake2b-128 of its UTF-8 bytes)", f"blobs[{i}].hash")
        checked.append((blob.hash, blob.text))
    return checked


def store(blobs: list[tuple[str, str]], project_id: int) -> protocol.BlobReply:
    """Fill the texts the server asked for, counted against the uploading project's quotas; any other
    text is ignored. `known`: the upload's other hashes, held already or never asked for (the answer
    does not say which). An upload that would cross a quota stores nothing: 507 (total) or 429 (day)."""
    unique = dict(sorted(blobs))
    with transaction.atomic():
        stored = table.fill(unique, project_id)
        if stored:
            quotas.check_bytes(project_id, "graph texts")  # raises, rolling this upload back
    return protocol.BlobReply(stored=sorted(stored), known=sorted(set(unique) - stored))
