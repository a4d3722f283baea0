"""Agreement travels once: a relay's batches as a `protocol.Packed` body, and back.

Why: at one step a second, 100,000 ranks send 100,000 batches a second, and nearly all of them say
the same thing (every replica's gradient fingerprints of a step, every rank's graph hashes of a
compile). A relay that holds the batches of many ranks sends each such event once, with the ranks
that hold it; only dissent travels rank by rank, and only what is each rank's own (its batch's
identity, its clock, its compile times) travels per rank.

Lossless, byte for byte: a batch is packed only when its JSON is msgspec's own encoding of it
(`packable`: what every agent sends), so `unpack` rebuilds exactly the bytes its agent sent and
the server takes their digest as for a batch sent alone (`ingest.writers.digest`). A resend of
the same batch, packed or not, through a relay or straight to the server, is the same batch: a
duplicate; other content under its (session, seq) is a 409. Standard library and msgspec only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, cast

import msgspec

from agents import protocol

OWN_FIELDS = ("ts", "times")  # what each rank reports of its own and still agrees: its clock, its compile timings
_TIMED = (protocol.Compile, protocol.CompileRuntime)
_Timed = protocol.Compile | protocol.CompileRuntime
_ENCODER = msgspec.json.Encoder()


class PackError(ValueError):
    """A `Packed` body whose parts do not fit (a holder out of range, two events at one place);
    `path` names the part, as a validation error's does."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


def packable(raw: bytes) -> protocol.Batch | None:
    """The batch, when `raw` is exactly its encoding (then `pack` may carry it); None otherwise (it
    travels as sent). Raises as `protocol.decode_batch` does for a body that is no batch."""
    batch = protocol.decode_batch(raw)
    return batch if _ENCODER.encode(batch) == raw else None


Entry = protocol.Batch | bytes  # a packable batch, or one that travels as sent (its exact JSON)


def order(entries: Sequence[Entry]) -> list[int]:
    """The places `pack` gives the entries: packed batches by run and rank (so the holders of an
    agreed event are a few ranges of ranks), then the others as they came. `BulkReply.results`
    follow this order."""
    batches = [i for i, e in enumerate(entries) if isinstance(e, protocol.Batch)]
    batches.sort(key=lambda i: _sort_key(entries[i]))
    return batches + [i for i, e in enumerate(entries) if not isinstance(e, protocol.Batch)]


def _sort_key(entry: Entry) -> tuple[str, int, str, int]:
    assert isinstance(entry, protocol.Batch)
    return entry.run.key, entry.rank, entry.session, entry.seq


def pack(entries: Sequence[Entry]) -> bytes:
    """A `Packed` body of the entries, in `order`: each event that two or more batches hold alike
    (but for `OWN_FIELDS`), at the same place of their events, goes once in `agreed`."""
    placed = [entries[i] for i in order(entries)]
    batches = [e for e in placed if isinstance(e, protocol.Batch)]
    runs: dict[bytes, int] = {}
    run_infos: list[protocol.RunInfo] = []
    holders: dict[bytes, list[tuple[int, int]]] = {}  # an event's shared part -> (batch, its place there)
    for b, batch in enumerate(batches):
        run = _ENCODER.encode(batch.run)
        if run not in runs:
            runs[run] = len(run_infos)
            run_infos.append(batch.run)
        for at, event in enumerate(batch.events):
            held = holders.setdefault(_ENCODER.encode(_common(event)), [])
            if not held or held[-1][0] != b:  # the same event twice in a batch: the second is its own
                held.append((b, at))
    shared: set[tuple[int, int]] = set()
    agreed = []
    for held in holders.values():
        if len(held) > 1:
            agreed.append(_agreed([batches[b].events[at] for b, at in held], held))
            shared.update(held)
    packed = protocol.Packed(
        v=protocol.PACKED_VERSION,
        runs=run_infos,
        batches=[
            protocol.PackedBatch(
                run=runs[_ENCODER.encode(batch.run)],
                rank=batch.rank,
                session=batch.session,
                seq=batch.seq,
                events=protocol.wire_events([e for at, e in enumerate(batch.events) if (b, at) not in shared]),
            )
            for b, batch in enumerate(batches)
        ],
        agreed=agreed,
        raw=[msgspec.Raw(e) for e in placed if isinstance(e, bytes)],
    )
    return _ENCODER.encode(packed)


def _common(event: protocol.Event) -> protocol.Event:
    """The event without what is each rank's own (`OWN_FIELDS`): what holders must share."""
    if isinstance(event, _TIMED):
        return msgspec.structs.replace(event, ts=0.0, times={})
    return msgspec.structs.replace(event, ts=0.0)


def _agreed(events: list[protocol.AnyEvent], held: list[tuple[int, int]]) -> protocol.Agreed:
    """One agreed event: the first holder's, the holders as ranges, and their own fields and places
    where they differ."""
    first = events[0]
    at = [place for _, place in held]
    ts = [e.ts for e in events]
    times = [cast(_Timed, e).times for e in events] if isinstance(first, _TIMED) else []
    return protocol.Agreed(
        event=first,
        of=list(_ranges([b for b, _ in held])),
        at=at[0],
        places=at if any(place != at[0] for place in at) else [],
        ts=ts if any(_ENCODER.encode(t) != _ENCODER.encode(first.ts) for t in ts) else [],
        # exact: keys in their order (the JSON's), -0.0 apart from 0.0
        times=times if any(_ENCODER.encode(t) != _ENCODER.encode(times[0]) for t in times) else [],
    )


def _ranges(indices: list[int]) -> Iterator[tuple[int, int]]:
    """Ascending indices as (first, last) ranges."""
    start = prev = indices[0]
    for i in indices[1:]:
        if i != prev + 1:
            yield start, prev
            start = i
        prev = i
    yield start, prev


def unpack(packed: protocol.Packed) -> list[tuple[protocol.Batch | None, bytes]]:
    """Each batch of a `Packed` body with its exact JSON, in the body's order (`batches`, then `raw`);
    a raw one comes as its bytes only (None: decode it as a batch sent alone). Raises `PackError`
    for parts that do not fit."""
    placed: list[dict[int, protocol.AnyEvent]] = [{} for _ in packed.batches]
    for a, agreed in enumerate(packed.agreed):
        for b, at, event in _holders(agreed, len(packed.batches), f"agreed[{a}]"):
            if at in placed[b]:
                raise PackError(f"batch {b} holds two agreed events at {at}", f"agreed[{a}].at")
            placed[b][at] = event
    out: list[tuple[protocol.Batch | None, bytes]] = []
    for b, part in enumerate(packed.batches):
        batch = _rebuilt(packed, part, placed[b], f"batches[{b}]")
        out.append((batch, _ENCODER.encode(batch)))
    return out + [(None, bytes(raw)) for raw in packed.raw]


def _holders(agreed: protocol.Agreed, count: int, path: str) -> Iterator[tuple[int, int, protocol.AnyEvent]]:
    """(holder's index, the event's place in it, its event) of one agreed event, its own fields set."""
    held = [b for first, last in agreed.of for b in range(first, last + 1)]
    if any(b >= count for b in held) or any(a >= b for a, b in zip(held, held[1:])):
        raise PackError("holders must be ascending ranges of batches", f"{path}.of")
    for name in ("places", *OWN_FIELDS):
        given = getattr(agreed, name)
        if given and len(given) != len(held):
            raise PackError(f"{name} must hold one value per holder ({len(held)})", f"{path}.{name}")
    if agreed.times and not isinstance(agreed.event, _TIMED):
        raise PackError("only compile events have times", f"{path}.times")
    for k, b in enumerate(held):
        yield b, agreed.places[k] if agreed.places else agreed.at, _own(agreed, k)


def _own(agreed: protocol.Agreed, k: int) -> protocol.AnyEvent:
    """The k-th holder's event: the agreed one with that holder's own fields."""
    changes: dict[str, Any] = {}
    if agreed.ts:  # set even when equal: -0.0 == 0.0, but not in JSON
        changes["ts"] = agreed.ts[k]
    if agreed.times:
        changes["times"] = agreed.times[k]
    return msgspec.structs.replace(agreed.event, **changes) if changes else agreed.event


def _rebuilt(
    packed: protocol.Packed, part: protocol.PackedBatch, placed: dict[int, protocol.AnyEvent], path: str
) -> protocol.Batch:
    """One batch as its agent sent it: its own events in order, each agreed one at its place."""
    if part.run >= len(packed.runs):
        raise PackError(f"no run {part.run}", f"{path}.run")
    total = len(part.events) + len(placed)
    if total > protocol.MAX_EVENTS_PER_BATCH:
        raise PackError(f"more than {protocol.MAX_EVENTS_PER_BATCH} events", f"{path}.events")
    if any(at >= total for at in placed):
        raise PackError("an agreed event past the batch's events", f"{path}.events")
    own = iter(part.events)
    events = [placed[at] if at in placed else next(own) for at in range(total)]
    return protocol.Batch(
        v=protocol.PROTOCOL_VERSION,
        run=packed.runs[part.run],
        rank=part.rank,
        session=part.session,
        seq=part.seq,
        events=events,
    )
