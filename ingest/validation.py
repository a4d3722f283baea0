"""Turn a raw request body into a validated `protocol.Batch`, or a 4xx with the failing path.

Everything here runs before anything is written, so a rejected batch changes nothing.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, TypeVar, cast

import msgspec
from django.db import models

from agents import agreement, protocol
from dashboard.evidence.models import CompileEvent, GradReport
from dashboard.ledger.models import DetailRequest, GradSlot, GradWatermark
from dashboard.ledger.slots import PARAM_PREFIX
from dashboard.tenancy.models import Rank, Run
from ingest.refusals import Refusal

T = TypeVar("T")

_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`")


def _path_of(message: str) -> tuple[str, str | None]:
    """msgspec says 'Expected `int`, got `str` - at `$.events[3].step`'; split off the path.

    A missing field is named in the message only; it becomes the last part of the path.
    """
    match = _PATH.search(message)
    error, path = (message[: match.start()], match.group("path").lstrip(".")) if match else (message, "")
    missing = _MISSING.match(error)
    if missing:
        path = f"{path}.{missing.group('field')}" if path else missing.group("field")
    return error, path or None


def read_body(raw: bytes, encoding: str, limit: int) -> bytes:
    """Undo Content-Encoding with a hard cap on the inflated size (`protocol.inflate`)."""
    try:
        return protocol.inflate(raw, encoding, limit)
    except protocol.BodyError as exc:
        raise Refusal(exc.status, str(exc)) from None


def _decoded(decoder: Callable[[bytes], T], body: bytes) -> T:
    """Run a protocol decoder; schema and JSON errors become 400s naming the failing path."""
    try:
        return decoder(body)
    except msgspec.ValidationError as exc:
        error, path = _path_of(str(exc))
        raise Refusal(400, error, path) from None
    except msgspec.DecodeError as exc:
        raise Refusal(400, f"malformed JSON: {exc}") from None
    except RecursionError:
        raise Refusal(400, "JSON nested too deeply") from None


def decode(body: bytes) -> protocol.Batch:
    return _checked(_decoded(protocol.decode_batch, body), body)


def decode_bulk(body: bytes) -> list[tuple[protocol.Batch, bytes]]:
    """Each batch of a bulk body with its exact bytes (what its digest is taken of); paths name `batches[i]`.
    Version 1 carries them as sent (`protocol.Bulk`), version 2 with their agreement once (`protocol.Packed`)."""
    if _decoded(protocol.bulk_version, body) == protocol.PACKED_VERSION:
        return _decode_packed(body)
    raws = _decoded(protocol.decode_bulk, body)
    batches = []
    for i, raw in enumerate(raws):
        try:
            batches.append((decode(raw), raw))
        except Refusal as refusal:
            raise refusal.within(f"batches[{i}]") from None
    return batches


def _decode_packed(body: bytes) -> list[tuple[protocol.Batch, bytes]]:
    """The batches of a `Packed` body, each rebuilt as its agent sent it (`agents.agreement.unpack`) and
    checked as a batch sent alone; `batches[i]` is its place in the reply."""
    try:
        items = agreement.unpack(_decoded(protocol.decode_packed, body))
    except agreement.PackError as exc:
        raise Refusal(400, str(exc), exc.path) from None
    batches = []
    for i, (batch, raw) in enumerate(items):
        try:
            batches.append((decode(raw) if batch is None else _checked(batch, raw), raw))
        except Refusal as refusal:
            raise refusal.within(f"batches[{i}]") from None
    return batches


def _checked(batch: protocol.Batch, body: bytes) -> protocol.Batch:
    """What the schema cannot say: rank within world_size, values that fit their columns, no NUL."""
    if batch.rank >= batch.run.world_size:
        raise Refusal(400, f"rank {batch.rank} is outside world_size {batch.run.world_size}", "rank")
    if b"\\u0000" in body:
        _reject_nul(msgspec.to_builtins(batch), "")
    for i, event in enumerate(batch.events):
        _check_storable(event, i)
    return batch


def decode_blobs(body: bytes) -> protocol.BlobUpload:
    upload = _decoded(protocol.decode_blobs, body)
    if b"\\u0000" in body:
        _reject_nul(msgspec.to_builtins(upload), "")
    return upload


def _max_length(*columns: tuple[type[models.Model], str]) -> int:
    """The narrowest of the columns a value is stored in, read from the models (never a copy)."""
    # each is a CharField: its max_length is set
    return min(
        cast(int, cast("models.Field[Any, Any]", model._meta.get_field(name)).max_length) for model, name in columns
    )


_GROUP_COLUMNS = ((GradReport, "group"), (GradSlot, "group"), (GradWatermark, "group"), (DetailRequest, "group"))
# Protocol bounds wider than the columns they land in: a value past these would be a database error,
# which no resend can cure. Weight fingerprints are stored under PARAM_PREFIX + group.
_COLUMN_LIMITS = {
    "group": _max_length(*_GROUP_COLUMNS),
    "compile_id": _max_length((CompileEvent, "compile_id")),
    "status": _max_length((CompileEvent, "status"), (Rank, "status")),
    "frame": _max_length((CompileEvent, "frame")),
}
_STORED_AS: dict[tuple[type, str], int] = {(protocol.Param, "group"): len(PARAM_PREFIX)}
_TORCH_VERSION = _max_length((Run, "torch_version"))
_INT4_MAX = (1 << 31) - 1
_TS_MAX = 32_503_680_000.0  # year 3000: past it, datetime (and timestamptz) overflow


@functools.cache
def _limits_of(kind: type[msgspec.Struct]) -> tuple[tuple[str, int], ...]:
    """(field, its longest storable value) of the fields of this event type that `_COLUMN_LIMITS` names."""
    return tuple(
        (name, column - _STORED_AS.get((kind, name), 0))
        for name, column in _COLUMN_LIMITS.items()
        if name in kind.__struct_fields__
    )


def _check_storable(event: protocol.Event, index: int) -> None:
    """One event's values against their columns; its path (`events[index]`) is written only for a refusal."""
    for name, limit in _limits_of(type(event)):
        value = getattr(event, name)
        if isinstance(value, str) and len(value) > limit:
            raise Refusal(400, f"{name} longer than {limit} characters", f"events[{index}].{name}")
    if not 0 <= event.ts <= _TS_MAX:
        raise Refusal(400, f"ts must be unix seconds in [0, {_TS_MAX:.0f}]", f"events[{index}].ts")
    if isinstance(event, protocol.Grads):  # the steady state: nothing more but its last step
        if event.step + (event.steps - 1) * event.stride > protocol.NONNEG_MAX:
            raise Refusal(400, f"last step exceeds {protocol.NONNEG_MAX}", f"events[{index}].steps")
    elif isinstance(event, protocol.RankStart) and len(event.versions.get("torch", "")) > _TORCH_VERSION:
        raise Refusal(400, f"torch version longer than {_TORCH_VERSION} characters", f"events[{index}].versions.torch")
    elif isinstance(event, protocol.Compile) and event.index > _INT4_MAX:
        raise Refusal(400, f"index exceeds {_INT4_MAX}", f"events[{index}].index")
    elif isinstance(event, protocol.RankEnd) and event.exit_code is not None and abs(event.exit_code) > _INT4_MAX:
        raise Refusal(400, "exit_code out of range", f"events[{index}].exit_code")


def _reject_nul(value: object, path: str) -> None:
    """PostgreSQL text and jsonb cannot hold U+0000: name the first string that has one."""
    if isinstance(value, str):
        if "\x00" in value:
            raise Refusal(400, "strings must not contain U+0000", path or None)
    elif isinstance(value, dict):
        for key, item in value.items():
            _reject_nul(key, path)
            _reject_nul(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _reject_nul(item, f"{path}[{i}]")


def decode_flight_record(body: bytes) -> protocol.FlightRecord:
    """`POST /api/v1/flight-recorder` body (limits: `protocol.MAX_FR_*`); no U+0000 (jsonb cannot hold it)."""
    if len(body) > protocol.MAX_FR_BYTES:
        raise Refusal(413, f"flight recorder dump exceeds {protocol.MAX_FR_BYTES} bytes")
    record = _decoded(protocol.decode_flight_record, body)
    if b"\\u0000" in body:
        _reject_nul(msgspec.to_builtins(record), "")
    return record
