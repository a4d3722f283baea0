"""The simulated rack's bodies: what the server is sent must be what real relays would send, or
the at-scale figures measure another product (docs/scale-out.md)."""

from __future__ import annotations

import argparse
import gzip
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgspec
import pytest

from agents import agreement, protocol
from bench.ingest_simulation import Divergence, Sender, Simulation, main


def simulation(ranks: int = 512) -> Simulation:
    args = argparse.Namespace(
        ranks_per_request=8,
        nodes_per_rack=32,
        seconds=20.0,
        step_time=1.0,
        buckets=4,
        diverge=True,
        heartbeat=5.0,
        param_every=50,
        abandon=False,
    )
    sim = Simulation(args, "http://127.0.0.1:1", "token", ranks)
    sim.divergence = Divergence(rank=300, step=10)
    return sim


def grads_of(body: bytes) -> dict[int, list[bytes]]:
    batches = agreement.unpack(msgspec.json.decode(body, type=protocol.Packed))
    return {b.rank: [e.fps for e in b.events if isinstance(e, protocol.Grads)] for b, _ in batches if b is not None}


def test_only_the_diverging_rank_reports_other_gradients_and_only_at_its_step():
    sim = simulation()
    for sender in sim.senders:
        sender.next_heartbeat = float("inf")  # gradients alone
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


def test_ranks_heartbeat_with_a_progress_sample_and_fingerprint_their_weights_as_agents_do():
    """At a heartbeat every rank of the rack sends a heartbeat and a progress sample, at every 50th
    step its weight fingerprints: alike on every rank, so they travel once, as the relays pack them."""
    sim = simulation()
    rack = sim.senders[1]
    rack.seq, rack.next_heartbeat = 1, 0.0  # a heartbeat is due
    packed = msgspec.json.decode(sim.packed_body(rack, 49, 50), type=protocol.Packed)
    assert sorted(type(a.event).__name__ for a in packed.agreed) == ["Grads", "Heartbeat", "Param", "Progress"]
    assert all(a.of == [(0, 255)] for a in packed.agreed) and not any(b.events for b in packed.batches)
    batches = [b for b, _ in agreement.unpack(packed) if b is not None]
    assert len(batches) == 256
    for batch in batches:
        kinds = {type(e): e for e in batch.events}
        assert kinds[protocol.Param].step == 50 and kinds[protocol.Progress].step == 51
        assert kinds[protocol.Progress].phase == "backward" and kinds[protocol.Heartbeat].step == 51
    assert time.time() < rack.next_heartbeat <= time.time() + 5.0  # the next one within a heartbeat, not before
    steady = msgspec.json.decode(sim.packed_body(rack, 51, 51), type=protocol.Packed)
    assert [type(a.event) for a in steady.agreed] == [protocol.Grads]


def test_the_report_says_how_much_of_a_core_the_simulated_agents_took():
    """At 100,000 ranks the one client process nears a core: the report says so beside the figures."""
    sim = simulation(256)
    sim.args.drain, sim.args.connections, sim.args.celery = 0.0, 0, 0
    sim.run_for(0.3)  # nothing listens on port 1: every agent keeps its batch and retries
    assert 0.0 < sim.client_core <= 1.0
    assert f"1 process(es) used {sim.client_core:.0%} of a core" in sim.report(0.3, None)[2]


class _Accepting(BaseHTTPRequestHandler):
    """Every request accepted, with the server asking for 2 s intervals: a stand-in server for the client."""

    protocol_version = "HTTP/1.1"
    ends: list[int] = []  # per request holding rank_end events: how many

    def do_POST(self) -> None:
        body = gzip.decompress(self.rfile.read(int(self.headers["Content-Length"])))
        if b"rank_end" in body:
            packed = msgspec.json.decode(body, type=protocol.Packed)
            self.ends.append(
                sum(1 for b, _ in agreement.unpack(packed) if b and isinstance(b.events[-1], protocol.RankEnd))
            )
        body = json.dumps({"results": [{"accepted": 1, "flush_interval_s": 2.0}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_agents_split_over_processes_report_as_one_job():
    """Two client processes, a rack each, on one clock: every step of every rank is counted once, each
    rack keeps the interval the server asked of it, every rank ends with its rank_end (once per rack),
    and the report names both processes."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Accepting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sim = simulation(512)
        sim.host, sim.port = "127.0.0.1", server.server_address[1]
        sim.divergence = None
        sim.args.step_time, sim.args.drain, sim.args.connections, sim.args.celery = 0.1, 2.5, 0, 0
        sim.run_for(0.6, clients=2)
    finally:
        server.shutdown()
    steps = sim.step_now(sim.t0 + 0.6) + 1
    assert steps >= 4 and sim.tally.rank_steps == steps * 512
    assert {step: got[0] for step, got in sim.tally.acked.items()} == dict.fromkeys(range(steps), 512)
    assert [s.interval for s in sim.senders] == [2.0, 2.0] and len(sim.tally.round_trips) == sim.tally.ok
    assert _Accepting.ends == [256, 256]
    assert "the simulated agents' 2 process(es) used" in sim.report(0.6, None)[2]


def test_the_command_line_parses(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--help"])
    assert exit.value.code == 0 and "--clients" in capsys.readouterr().out
