"""The simulated rack's bodies: what the server is sent must be what real relays would send, or
the at-scale figures measure another product (docs/scale-out.md)."""

from __future__ import annotations

import argparse

import msgspec

from agents import agreement, protocol
from bench.ingest_simulation import Divergence, Sender, Simulation


def simulation(ranks: int = 512) -> Simulation:
    args = argparse.Namespace(
        ranks_per_request=8, nodes_per_rack=32, seconds=20.0, step_time=1.0, buckets=4, diverge=True
    )
    sim = Simulation(args, "http://127.0.0.1:1", "token", ranks)
    sim.divergence = Divergence(rank=300, step=10)
    return sim


def grads_of(body: bytes) -> dict[int, list[bytes]]:
    batches = agreement.unpack(msgspec.json.decode(body, type=protocol.Packed))
    return {b.rank: [e.fps for e in b.events if isinstance(e, protocol.Grads)] for b, _ in batches if b is not None}


def test_only_the_diverging_rank_reports_other_gradients_and_only_at_its_step():
    sim = simulation()
    sim.check_packing()
    rack = next(s for s in sim.senders if 300 in s.ranks)
    first = grads_of(sim.packed_body(rack, 0, 0))  # every rank's start
    assert len(first) == 256 and len({fps[0] for fps in first.values()}) == 1
    at = grads_of(sim.packed_body(rack, 9, 10))
    assert {r for r, fps in at.items() if fps != at[rack.ranks[0]]} == {300}
    later = grads_of(sim.packed_body(rack, 11, 11))
    assert len({fps[0] for fps in later.values()}) == 1
    elsewhere = next(s for s in sim.senders if 300 not in s.ranks)
    elsewhere.seq = 1
    assert len({fps[0] for fps in grads_of(sim.packed_body(elsewhere, 10, 10)).values()}) == 1


def test_a_rack_resends_nothing_twice_under_one_seq():
    sim = simulation()
    rack = Sender(sim.senders[0].ranks, sim.senders[0].sessions)
    seqs = [msgspec.json.decode(sim.packed_body(rack, s, s), type=protocol.Packed).batches[0].seq for s in range(3)]
    assert seqs == [0, 1, 2]
