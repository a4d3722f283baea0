"""The statements of the graph-text table: who was asked for which text, the texts stored, and
what retention prunes. Every statement is within one project: its texts are its own, so what another
project stored never changes what it is asked or told. When to ask and what a project may store is
ingest's policy (`ingest.blobs`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from dashboard.evidence.models import Blob
from dashboard.tenancy.models import Project

BLOB = Blob._meta.db_table
PROJECT = Project._meta.db_table  # tenancy's table, by its model's name
NAMED_REFRESH = "1 hour"  # how stale `named_at` may get before a naming batch refreshes it (a write, a row lock)
PRUNE_CHUNK = 1000


def asked(run_id: int) -> int:
    """Texts asked of the run."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {BLOB} WHERE run_id = %s", [run_id])
        count: int = cur.fetchone()[0]
        return count


def ask(hashes: list[str], project_id: int, run_id: int, lease: float) -> list[str]:
    """Record the hashes as named by the project and, where it lacks them and no lease (seconds) of
    its own runs, as asked of this run now; returns those asked."""
    if not hashes:
        return []
    with connection.cursor() as cur:
        cur.execute(
            f"""
            INSERT INTO {BLOB} AS b (hash, size, requested_at, named_at, project_id, run_id)
            SELECT h, 0, now(), now(), %(project)s, %(run)s FROM unnest(%(hashes)s::text[]) AS h ORDER BY h
            ON CONFLICT (project_id, hash) DO UPDATE SET
              requested_at = CASE WHEN b.text IS NULL AND b.requested_at < now() - make_interval(secs => %(lease)s)
                                  THEN now() ELSE b.requested_at END,
              run_id = CASE WHEN b.text IS NULL THEN EXCLUDED.run_id ELSE b.run_id END,
              named_at = now()
              WHERE (b.text IS NULL AND b.requested_at < now() - make_interval(secs => %(lease)s))
                 OR b.named_at IS NULL OR b.named_at < now() - interval '{NAMED_REFRESH}'
            RETURNING hash, requested_at = now() AND text IS NULL
            """,
            {"hashes": hashes, "lease": lease, "project": project_id, "run": run_id},
        )
        return [row[0] for row in cur.fetchall() if row[1]]


def name(hashes: list[str], project_id: int) -> None:
    """Mark the project's texts as named (retention), without asking for any."""
    if hashes:
        with connection.cursor() as cur:
            cur.execute(
                f"UPDATE {BLOB} SET named_at = now() WHERE project_id = %s AND hash = ANY(%s::text[]) "
                f"AND (named_at IS NULL OR named_at < now() - interval '{NAMED_REFRESH}')",
                [project_id, hashes],
            )


def fill(texts: dict[str, str], project_id: int) -> set[str]:
    """Store the texts the project was asked for and still lacks; returns their hashes."""
    with connection.cursor() as cur:
        cur.execute(
            f"""
            UPDATE {BLOB} AS b SET text = u.t, size = octet_length(u.t), stored_at = now()
            FROM unnest(%s::text[], %s::text[]) AS u(h, t)
            WHERE b.project_id = %s AND b.hash = u.h AND b.text IS NULL
            RETURNING b.hash
            """,
            [list(texts), list(texts.values()), project_id],
        )
        return {row[0] for row in cur.fetchall()}


def stored_bytes(project_id: int) -> tuple[int, int]:
    """(bytes of text the project stored in all, of those within a day)."""
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT COALESCE(sum(size), 0), COALESCE(sum(size) FILTER (WHERE stored_at > now() - interval '1 day'), 0) "
            f"FROM {BLOB} WHERE project_id = %s AND stored_at IS NOT NULL",
            [project_id],
        )
        stored: tuple[int, int] = cur.fetchone()
        return stored


def usage() -> list[tuple[str, int, int]]:
    """(project name, bytes stored, bytes stored within a day) of every project holding texts (/metrics)."""
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT p.name, sum(b.size), COALESCE(sum(b.size) FILTER (WHERE b.stored_at > now() - interval '1 day'), 0) "
            f"FROM {BLOB} b JOIN {PROJECT} p ON p.id = b.project_id WHERE b.stored_at IS NOT NULL GROUP BY p.name ORDER BY p.name"
        )
        rows: list[tuple[str, int, int]] = cur.fetchall()
        return rows


def prune(now: datetime, retention: timedelta) -> int:
    """Delete, in chunks (short statements, short locks), texts no compile event named within
    `retention` and requests nobody answered for a day; returns how many rows went."""
    removed = 0
    params: dict[str, Any] = {"now": now, "retention": retention}  # psycopg sends a timedelta as an interval
    with connection.cursor() as cur:
        while True:
            cur.execute(
                f"""
                DELETE FROM {BLOB} WHERE id IN (
                  SELECT id FROM {BLOB}
                  WHERE (text IS NULL AND requested_at < %(now)s - interval '1 day')
                     OR COALESCE(named_at, stored_at, requested_at) < %(now)s - %(retention)s
                  LIMIT {PRUNE_CHUNK})
                """,
                params,
            )
            deleted: int = cur.rowcount
            removed += deleted
            if deleted < PRUNE_CHUNK:
                return removed
