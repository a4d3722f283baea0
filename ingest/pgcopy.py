"""PostgreSQL binary COPY, encoded by hand for the one hot table (ingest_gradreport).

psycopg's `write_row` dumps every value through Python-level adapters (~10 us per grad row with
a 16-element array). Here a grad row is one `struct` pack of fields encoded once per request
(run, ranks, group, times), its own values and a slice of one pre-built array buffer, whose
fingerprints were byte-swapped and interleaved by C slice assignments.
Format: https://www.postgresql.org/docs/current/sql-copy.html (Binary Format).
"""
from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable
from datetime import datetime, timezone

HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
TRAILER = struct.pack(">h", -1)
NULL = struct.pack(">i", -1)
FIELD_COUNT = [struct.pack(">h", n) for n in range(32)]  # a row's first two bytes
INT4_OID = 23
INT8_OID = 20
_PG_EPOCH_US = 946_684_800 * 1_000_000  # 2000-01-01T00:00:00Z in unix microseconds

_int4 = struct.Struct(">ii").pack  # (4, value)
_int8 = struct.Struct(">iq").pack  # (8, value)
_float8 = struct.Struct(">id").pack  # (8, value)
_array_head = struct.Struct(">iiiIii").pack  # (byte length, ndim, has_null, elem oid, dim, lower bound)


def int8(value: int) -> bytes:
    return _int8(8, value)


def int4_array(values: list[int]) -> bytes:
    """A one-dimensional `integer[]` field value (no NULLs), length word included."""
    n = len(values)
    return struct.pack(f">i5i{2 * n}i", 20 + 8 * n, 1, 0, INT4_OID, n, 1, *[x for v in values for x in (4, v)])


def float8(value: float | None) -> bytes:
    return NULL if value is None else _float8(8, value)


def text(value: str) -> bytes:
    data = value.encode()
    return struct.pack(">i", len(data)) + data


def timestamptz(when: float | datetime) -> bytes:
    """Unix seconds or an aware datetime -> microseconds since 2000-01-01 UTC."""
    if isinstance(when, datetime):
        when = when.astimezone(timezone.utc).timestamp()
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
        body[4 + k::12] = big[k::8]
    head = _array_head(20 + 12 * width, 1, 0, INT8_OID, width, 1)
    stride = 12 * width
    return [head + body[i:i + stride] for i in range(0, 12 * n, stride)]


def u64_list_bytes(values: Iterable[int]) -> bytes:
    """u64 ints (the `grad` event's list form) -> the little-endian bytes `int8_arrays` takes."""
    return array("Q", values).tobytes() if sys.byteorder == "little" else b"".join(v.to_bytes(8, "little") for v in values)


def empty_int8_array() -> bytes:
    """A zero-dimensional `bigint[]` (a grad event with no buckets)."""
    return _int4(12, 0) + struct.pack(">iI", 0, INT8_OID)
