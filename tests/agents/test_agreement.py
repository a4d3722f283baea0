"""Packing a relay's batches (`agents.agreement`): agreement once, every batch rebuilt byte for byte."""

from __future__ import annotations

import msgspec

from agents import agreement, protocol

RUN = protocol.RunInfo(key="agree", world_size=16)
HASHES = {"dynamo": protocol.GraphHash(raw="ab" * 8, norm="cd" * 16)}


def _batch(rank: int, events: list[protocol.AnyEvent], key: str = "agree") -> protocol.Batch:
    run = RUN if key == "agree" else protocol.RunInfo(key=key, world_size=16)
    return protocol.Batch(v=1, run=run, rank=rank, session=f"agree-session-{rank}", seq=rank * 3, events=events)


def _round_trip(entries: list[protocol.Batch | bytes]) -> protocol.Packed:
    raws = [e if isinstance(e, bytes) else protocol.encode(e) for e in entries]
    body = agreement.pack(entries)
    packed = protocol.decode_packed(body)
    rebuilt = [raw for _, raw in agreement.unpack(packed)]
    assert rebuilt == [raws[i] for i in agreement.order(entries)]
    return packed


def test_replicas_send_their_fingerprints_once_and_their_clocks_and_compile_times_each():
    batches = []
    for rank in range(12):
        compile_ = protocol.Compile(frame="f", hashes=HASHES, times={"total": 1.0 + rank}, ts=5.0 + rank)
        grads = protocol.Grads.pack(0, [[rank == 7 and 9 or 1, 2]] * 2, ts=1e9 + rank / 8)
        batches.append(_batch(rank, [compile_, grads] if rank % 4 else [grads, compile_]))
    packed = _round_trip(list(reversed(batches)))
    assert len(packed.agreed) == 2
    compile_ = next(a for a in packed.agreed if isinstance(a.event, protocol.Compile))
    grads = next(a for a in packed.agreed if isinstance(a.event, protocol.Grads))
    assert compile_.of == [(0, 11)] and len(compile_.times) == 12 and compile_.places  # places differ by rank
    assert grads.of == [(0, 6), (8, 11)]  # rank 7 dissents: its own grads travel in its batch
    assert [len(b.events) for b in packed.batches] == [0] * 7 + [1] + [0] * 4


def test_what_cannot_be_shared_travels_as_it_was():
    zero = protocol.Step(step=0, ts=0.0)
    negative_zero = protocol.Step(step=0, ts=-0.0)  # the same number, other bytes
    twice = protocol.Heartbeat(step=1, ts=2.0)
    odd = b'{"v":1,  "run":{"key":"agree","world_size":16},"rank":9,"session":"agree-session-9","seq":0,"events":[]}'
    assert agreement.packable(odd) is None
    entries: list[protocol.Batch | bytes] = [
        _batch(0, [zero, twice, twice]),
        _batch(1, [negative_zero, twice]),
        _batch(2, [zero], key="other-run"),
        odd,
    ]
    packed = _round_trip(entries)
    assert len(packed.runs) == 2 and [bytes(r) for r in packed.raw] == [odd]


def test_holders_must_fit_the_batches():
    body = msgspec.json.decode(agreement.pack([_batch(r, [protocol.Step(step=1)]) for r in range(3)]))
    for change, path in [
        ({"of": [[0, 3]]}, "agreed[0].of"),
        ({"of": [[1, 2], [0, 0]]}, "agreed[0].of"),
        ({"places": [0]}, "agreed[0].places"),
        ({"times": [{}, {}, {}]}, "agreed[0].times"),
    ]:
        broken = {**body, "agreed": [{**body["agreed"][0], **change}]}
        try:
            agreement.unpack(protocol.decode_packed(msgspec.json.encode(broken)))
        except agreement.PackError as exc:
            assert exc.path == path
        else:
            raise AssertionError(f"{change} was taken")
