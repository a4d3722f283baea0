"""PostgreSQL's binary protocol: binary COPY encoded by hand for the writers, psycopg plumbing, and binary reads.

Why a module of its own: this is the wire format and the driver, not what a batch means. Ingest
(`ingest.writers`) decides what a group commits and `writes` turns it into rows; here is only how
they reach PostgreSQL fast. `query` also runs ingest's claim statement, whose fragments other
apps build.

Grad rows (evidence_gradreport, nearly all of the volume): psycopg's `write_row` dumps every value
through Python-level adapters (~10 us per grad row with a 16-element array). Here a grad row is
one `struct` pack of fields encoded once per request (run, ranks, group, times), its own values
and a slice of one pre-built array buffer, whose fingerprints were byte-swapped and interleaved
by C slice assignments. The rare kinds go through psycopg's binary `write_row` (`copy_rows`).
The batch statements run as server-side prepared statements (`query`).
Format: https://www.postgresql.org/docs/current/sql-copy.html (Binary Format).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from itertools import repeat
from typing import Any

import msgspec
import psycopg
import psycopg.types.json
from django.db import connection

from agents import protocol

HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
TRAILER = struct.pack(">h", -1)
NULL = struct.pack(">i", -1)
FIELD_COUNT = [struct.pack(">h", n) for n in range(32)]  # a row's first two bytes
INT4_OID = 23
INT8_OID = 20
_PG_EPOCH_US = 946_684_800 * 1_000_000  # 2000-01-01T00:00:00Z in unix microseconds

_int4 = struct.Struct(">ii").pack  # (4, value)
_int8 = struct.Struct(">iq").pack  # (8, value)
_array_head = struct.Struct(">iiiIii").pack  # (byte length, ndim, has_null, elem oid, dim, lower bound)


def int8(value: int) -> bytes:
    return _int8(8, value)


def int4_array(values: list[int]) -> bytes:
    """A one-dimensional `integer[]` field value (no NULLs), length word included."""
    n = len(values)
    return struct.pack(f">i5i{2 * n}i", 20 + 8 * n, 1, 0, INT4_OID, n, 1, *[x for v in values for x in (4, v)])


def text(value: str) -> bytes:
    data = value.encode()
    return struct.pack(">i", len(data)) + data


def timestamptz(when: float | datetime) -> bytes:
    """Unix seconds or an aware datetime -> microseconds since 2000-01-01 UTC."""
    if isinstance(when, datetime):
        when = when.astimezone(UTC).timestamp()
    return _int8(8, round(when * 1_000_000) - _PG_EPOCH_US)


def int8_arrays(le_u64: bytes, width: int) -> list[bytes]:
    """Split little-endian u64s into `bigint[]` field values of `width` elements each (same bits, signed).

    One buffer for all rows: the element bodies are the byte-swapped u64s with a 4-byte length
    (always 8) before each, which `bytearray` slice assignment with a stride builds in C.
    """
    values = array("Q")
    values.frombytes(le_u64)
    if sys.byteorder == "little":
        values.byteswap()
    big = values.tobytes()
    n = len(values)
    body = bytearray(12 * n)
    body[3::12] = b"\x08" * n
    for k in range(8):
        body[4 + k :: 12] = big[k::8]
    head = _array_head(20 + 12 * width, 1, 0, INT8_OID, width, 1)
    stride = 12 * width
    return [head + body[i : i + stride] for i in range(0, 12 * n, stride)]


def u64_list_bytes(values: Iterable[int]) -> bytes:
    """u64 ints (the `grad` event's list form) -> the little-endian bytes `int8_arrays` takes."""
    return (
        array("Q", values).tobytes() if sys.byteorder == "little" else b"".join(v.to_bytes(8, "little") for v in values)
    )


def empty_int8_array() -> bytes:
    """A zero-dimensional `bigint[]` (a grad event with no buckets)."""
    return _int4(12, 0) + struct.pack(">iI", 0, INT8_OID)


def when(ts: float, now: datetime) -> datetime:
    """An event's time (agent's unix seconds), or the arrival time when the agent sent none."""
    return datetime.fromtimestamp(ts, UTC) if ts > 0 else now


class _JsonInC(psycopg.types.json.JsonLoader):
    """The claim statement's `json` results (watermarks, detail requests) decoded by msgspec."""

    _loads = staticmethod(msgspec.json.decode)  # type: ignore[assignment]  # decode takes what json.loads does, and more


_EXPLICIT_ONLY = 1 << 30  # prepare_threshold: only statements executed with prepare=True are prepared


@lru_cache(maxsize=64)
def _compact(sql: str) -> str:
    """One space for each run of whitespace: the batch statements stay under psycopg's 4 KiB limit for
    caching their conversion from %(name)s placeholders (longer ones are parsed again at every call)."""
    return " ".join(sql.split())


def query(sql: str, params: dict[str, Any], rows: bool = True) -> list[tuple[Any, ...]]:
    """Run one of the batch statements as a server-side prepared statement (parsed and planned once
    per connection instead of once per batch: the planning of these CTEs cost about as much as
    running them; which is also why their plans must not depend on the parameters' values: see
    `slots.watermarks_before`). Django's own cursors bind client-side and never prepare; psycopg errors become
    django.db errors as with them (so a dead database is a 503)."""
    connection.ensure_connection()
    with connection.wrap_database_errors:
        raw = connection.connection
        if raw.prepare_threshold is None:
            raw.prepare_threshold = _EXPLICIT_ONLY
            raw.adapters.register_loader("json", _JsonInC)  # not jsonb: Django reads that as text
        with psycopg.Cursor(raw) as cur:
            cur.execute(_compact(sql), params, prepare=True)
            return cur.fetchall() if rows else []


def fetch_binary(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """All rows of a read in PostgreSQL's binary format (for the tens of thousands of numbers a compile
    bill reads, parsing text costs more than the query); errors become django.db errors as in `query`."""
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cur:
        cur.execute(sql, params, binary=True)
        return cur.fetchall()


def copy_stream(table: str, columns: tuple[str, ...], chunks: Iterable[bytes]) -> None:
    cols = ", ".join(f'"{c}"' for c in columns)
    with (
        connection.wrap_database_errors,
        connection.connection.cursor() as cur,
        cur.copy(f"COPY {table} ({cols}) FROM STDIN (FORMAT BINARY)") as copy,
    ):
        for chunk in chunks:
            copy.write(chunk)


def copy_rows(table: str, columns: tuple[tuple[str, str], ...], rows: Iterable[Sequence[Any]]) -> None:
    """psycopg binary COPY with declared types, for the low-volume tables."""
    cols = ", ".join(f'"{name}"' for name, _ in columns)
    with (
        connection.wrap_database_errors,
        connection.connection.cursor() as cur,
        cur.copy(f"COPY {table} ({cols}) FROM STDIN (FORMAT BINARY)") as copy,
    ):
        copy.set_types([kind for _, kind in columns])
        for row in rows:
            copy.write_row(row)


GRAD_COLUMNS = ("run_id", "ranks", "group", "step", "fps", "norm", "nonfinite", "ts", "received")


@dataclass
class GradEvents:
    """A batch's grad events in both forms, and what slot counting needs of them."""

    packed: list[protocol.Grads]
    listed: list[protocol.Grad]  # `grad` events and weight fingerprints (`_weights_as_grad`)
    rows: int = field(init=False)  # rank-steps: a `grads` event counts each of its steps
    groups: list[tuple[str, list[int]]] = field(init=False)  # each group, its sorted distinct steps

    def __post_init__(self) -> None:
        self.rows = sum(e.steps for e in self.packed) + len(self.listed)
        self.groups = self._groups()

    def _groups(self) -> list[tuple[str, list[int]]]:
        """What `slots.grad_reports_params` takes."""
        if len(self.packed) == 1 and not self.listed:  # the steady state
            e = self.packed[0]
            return [(e.group, list(e.step_numbers()))]
        steps: dict[str, list[Iterable[int]]] = {}
        for e in self.packed:
            steps.setdefault(e.group, []).append(e.step_numbers())
        for g in self.listed:
            steps.setdefault(g.group, []).append((g.step,))
        out = []
        for group in sorted(steps):
            pieces = steps[group]
            if len(pieces) == 1 and isinstance(pieces[0], range) and pieces[0].step > 0:
                out.append((group, list(pieces[0])))
            else:
                out.append((group, sorted({s for piece in pieces for s in piece})))
        return out


# (run id, group, step, fingerprints as little-endian u64 bytes, norm, nonfinite): one grad row's own fields
GradKey = tuple[int, str, int, bytes, float | None, int]


def _reports(reports: list[tuple[int, int, GradEvents]]) -> dict[GradKey, tuple[list[int], float]]:
    """(run id, group, step, fingerprints as little-endian u64 bytes, norm, nonfinite) -> (ranks, first
    report's time), per rank-step of both forms."""
    rows: dict[GradKey, tuple[list[int], float]] = {}
    for run_id, rank, events in reports:
        for e in events.packed:
            width = 8 * e.buckets
            fps = e.fps
            for i, step, norm, bad in zip(
                range(0, len(fps), width), e.step_numbers(), e.norms or repeat(None), e.nonfinite or repeat(0)
            ):
                rows.setdefault((run_id, e.group, step, fps[i : i + width], norm, bad), ([], e.ts))[0].append(rank)
        for g in events.listed:
            key = (run_id, g.group, g.step, u64_list_bytes(g.fps), g.norm, g.nonfinite)
            rows.setdefault(key, ([], g.ts))[0].append(rank)
    return rows


def grad_copy(reports: list[tuple[int, int, GradEvents]], now: datetime) -> list[bytes]:
    """The grad rows (`GRAD_COLUMNS`, field count included) of (run id, rank, events) reports.

    Ranks that reported a step alike share its row, which lists them all (`ranks`): agreeing
    replicas (a node's ranks through one relay, in one request) cost one row per step instead of
    one per rank-step, here and in everything that reads them. A shared row keeps the first
    report's time. The fingerprint arrays of rows of one width are byte-swapped together
    (`int8_arrays`); the leading fields (run, ranks, group) and the times are encoded once
    per distinct value, and a row is one `struct` pack of those and its own fields.
    """
    rows = _reports(reports)
    by_width: dict[int, list[tuple[GradKey, tuple[list[int], float]]]] = {}
    for key, row in rows.items():
        by_width.setdefault(len(key[3]), []).append((key, row))
    received = timestamptz(now)
    heads: dict[tuple[Any, ...], bytes] = {}
    tails: dict[float, bytes] = {}
    parts = []
    for width, of_width in by_width.items():
        fps = b"".join(key[3] for key, _ in of_width)
        arrays = int8_arrays(fps, width // 8) if width else repeat(empty_int8_array())
        for ((run_id, group, step, _, norm, nonfinite), (ranks, ts)), fps_array in zip(of_width, arrays):
            head = heads.get(lead := (run_id, tuple(ranks), group))
            if head is None:
                head = heads[lead] = FIELD_COUNT[len(GRAD_COLUMNS)] + int8(run_id) + int4_array(ranks) + text(group)
            tail = tails.get(ts)
            if tail is None:
                tail = tails[ts] = timestamptz(when(ts, now)) + received
            pack = _row_packer(len(head), len(fps_array), norm is not None)
            parts.append(
                pack(head, 8, step, fps_array, 8, norm, 8, nonfinite, tail)
                if norm is not None
                else pack(head, 8, step, fps_array, NULL, 8, nonfinite, tail)
            )
    return parts


_row_packers: dict[tuple[int, int, bool], Callable[..., bytes]] = {}


def _row_packer(head: int, array: int, norm: bool) -> Callable[..., bytes]:
    """`struct` packer of a grad row: head (run, ranks, group), step, fingerprint array, norm (or NULL), nonfinite, tail (ts, received)."""
    key = (head, array, norm)
    packer = _row_packers.get(key)
    if packer is None:
        if len(_row_packers) > 256:
            _row_packers.clear()
        packer = _row_packers[key] = struct.Struct(f">{head}siq{array}s{'id' if norm else '4s'}iq24s").pack
    return packer
