"""A whole job at the agents' real cadence: up to 16,384 simulated ranks against real ingest processes.

Every rank behaves as `agents/transport.py` does: it flushes at multiples of its flush interval on
the wall clock (0.5 s, or the longer one the server's reply asks for, `flush_interval_s`, where it
spares batches: `agents.transport.kept_interval`), one
request at a time; a batch the server did not accept (429, 503, a timeout after 10 s) stays in
its backlog (the spool) and is sent again, first, after Retry-After or its backoff. The job's
ranks all complete a step every `--step-time` seconds; a batch carries the steps done since the
last one, as one compact `grads` event, and what the agent adds by default (`Simulation.cadence`: a
heartbeat and a progress sample every 5 s, weight fingerprints every 50 steps); a rank's first
batch also holds its start, its rank_start
and the compile events the real agent recorded (`bench/data/agent-events.json`), alike on every
rank, so the tree packs them once per rack. `--ranks-per-request 8` sends a node's 8 batches as one
bulk request, as a node relay forwards them. `--nodes-per-rack 32` adds the rack level of a relay
tree (docs/scale-out.md): a rack's node relays pack their ranks' batches and the rack relay sends
them as one `protocol.Packed` request per flush. The relays' packing is done in this process, the
way `agents.agreement.pack` packs agreeing batches (every simulated rank reports the same
fingerprints at the same clock, so a rack's batches share one agreed event; `packed_body` is
checked against `pack` at start): one sender per rack stands for its ranks, which flush together
and keep together what was not accepted (a relay keeps nothing, so a refused rack request is
every one of its agents' batch, resent by each at its next flush). Bodies are generated; the
server (uvicorn workers, PostgreSQL, Redis) is the real one, on the same machine as this client.

It prints, per job size: the steps the job made and the steps the server took (rank-steps/s),
requests/s, how many requests were answered with something other than 200 (the agents' retry
rate), the flush intervals the agents ended with, and the added detection latency: for each step,
when the server had accepted the last rank's report of it (the moment its grad slot can be
settled) after the step ended, over the second half of the run (percentiles of the steps), and
the same for the first step, which every rank's start comes with. When the
job stops making steps, each rank sends its rank_end, as an agent does when its process exits
(`--abandon`: none, as when the scheduler kills the job), and the agents go on sending what was
not accepted yet for `--drain` seconds: "accepted" counts what the server took by then, so 100%
means nothing was lost or left behind. Every request has a connection of its own, as the agents'
and relays' urllib opens one.

With `--celery N` the server's Celery workers (with beat) settle the slots as they would in
production, and the report adds, per step of the second half, when its grad slot was settled
after the step ended (the moment a divergence at that step can be found). `--diverge` makes one
rank, picked at random, report other gradient fingerprints at the job's middle step, and times the
page: from that step's end to a JSON webhook's receipt of the incident (a receiver this process
runs, as `fault_to_page` does), and checks that the run has one incident, rooted at that rank.

    python -m bench ingest_simulation                                  # 1024, 4096, 16384 ranks, direct
    python -m bench ingest_simulation --ranks 16384 --ranks-per-request 8 --seconds 60
    python -m bench ingest_simulation --ranks 16384 --ranks-per-request 8 --nodes-per-rack 32 --step-time 1.0
    python -m bench ingest_simulation --ranks 16384 --ranks-per-request 8 --nodes-per-rack 32 --step-time 1.0 \
        --celery 1 --diverge
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import statistics
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec

from agents import transport
from bench.common import (
    bench_env,
    compile_burst,
    fingerprints,
    fresh_database,
    gzip_body,
    recording,
    setup_django,
    start_servers,
)
from bench.fault_matrix import Receiver, configure_webhook
from bench.results import report

HTTP_TIMEOUT = 10.0  # agents.transport.HTTP_TIMEOUT
BACKOFF_BASE, BACKOFF_MAX = 0.25, 10.0  # agents.transport's


@dataclass
class Sender:
    """One agent (or one node relay's 8 agents): its backlog, interval and backoff."""

    ranks: list[int]
    sessions: list[str]
    seq: int = 0
    sent_through: int = -1  # last step queued
    ended: bool = False  # its ranks' rank_end is queued
    backlog: list[tuple[bytes, int, int]] = field(default_factory=list)  # (body, first step, last step)
    interval: float = 0.5
    asked: float = 0.5  # the longest interval the server asked for (kept only where it spares batches)
    not_before: float = 0.0
    failures: int = 0
    next_heartbeat: float = 0.0  # when its ranks' next heartbeat is due (`Simulation.cadence`)


@dataclass
class Tally:
    ok: int = 0
    refused: dict = field(default_factory=dict)  # status (or "timeout") -> count
    rank_steps: int = 0
    acked: dict = field(default_factory=dict)  # step -> [ranks acked, last ack time]
    round_trips: list = field(default_factory=list)  # seconds from sending a request to its 200


@dataclass(frozen=True)
class Divergence:
    """One rank's gradients differ from the other replicas' at one step."""

    rank: int
    step: int


class Simulation:
    def __init__(self, args, url: str, token: str, ranks: int) -> None:
        self.args, self.token, self.ranks = args, token, ranks
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        self.run: dict[str, Any] = {
            "key": f"sim-{ranks}-{uuid.uuid4().hex[:8]}",
            "world_size": ranks,
            "name": "simulated job",
        }
        per = args.ranks_per_request * max(args.nodes_per_rack, 1)
        self.senders = [
            Sender(list(range(r, min(r + per, ranks))), [str(uuid.uuid4()) for _ in range(min(per, ranks - r))])
            for r in range(0, ranks, per)
        ]
        self.tally = Tally()
        self.slots = asyncio.Semaphore()  # one process's requests in flight at once (`_agents`)
        self.packed: dict[tuple[int, int], str] = {}  # every rank reports the same fingerprints for a step
        self.grads: dict[tuple[int, int], Any] = {}  # the same, as a `protocol.Grads` (the tree's agreed event)
        self.compiles = [e for e in recording() if e["t"] in ("compile", "graph_break")]  # every rank's alike
        self.t0, self.client_core, self.clients = 0.0, 0.0, 1
        middle = int(args.seconds / args.step_time / 2)
        self.divergence = Divergence(random.randrange(ranks), middle) if args.diverge else None

    def step_now(self, now: float) -> int:
        """The last step every rank has completed by `now`."""
        return int((now - self.t0) / self.args.step_time) - 1

    def start(self, rank: int) -> list[dict]:
        """What a rank's first batch holds before its step: its rank_start and its compile events."""
        return compile_burst(self.compiles, rank)

    def cadence(self, sender: Sender, first: int, last: int) -> list[Any]:
        """What an agent adds to a batch besides its gradients, as `agents.transport` and `agents.grads`
        do by default: at each heartbeat (`--heartbeat`) a heartbeat and a progress sample (the rank in
        its next step's backward, where a healthy rank mostly is), and the weight fingerprints of every
        `--param-every`-th step. A sender's ranks started together, so they heartbeat together; the
        senders' heartbeats are spread over the interval (`run_for`)."""
        from agents import protocol

        now = time.time()
        events: list[Any] = []
        if self.args.heartbeat and now >= sender.next_heartbeat:
            missed = int((now - sender.next_heartbeat) / self.args.heartbeat)  # a late flush sends one, not several
            sender.next_heartbeat += self.args.heartbeat * (1 + missed)
            events += [
                protocol.Heartbeat(ts=now, step=last + 1),
                protocol.Progress(
                    ts=now, phase="backward", phase_s=0.1, step=last + 1, since_step_s=0.3, where="train.py:88:step"
                ),
            ]
        if self.args.param_every:
            events += [
                protocol.Param(ts=now, step=step, fps=fingerprints(step + 1_000_000, self.args.buckets))
                for step in range(first, last + 1)
                if step % self.args.param_every == 0
            ]
        return events

    def body(self, sender: Sender, first: int, last: int) -> bytes:
        from agents import protocol

        if self.args.nodes_per_rack:
            return gzip_body(self.packed_body(sender, first, last))
        extra = "".join("," + protocol.encode(e).decode() for e in self.cadence(sender, first, last))
        packed = self.packed.get((first, last))
        if packed is None:
            rows = [fingerprints(s, self.args.buckets) for s in range(first, last + 1)]
            packed = self.packed[first, last] = protocol.encode(
                protocol.Grads.pack(first, rows, ts=time.time())
            ).decode()
        bodies = []
        for rank, session in zip(sender.ranks, sender.sessions):
            head = json.dumps(
                {"v": 1, "run": self.run, "rank": rank, "session": session, "seq": sender.seq}, separators=(",", ":")
            )
            start = (
                "".join(json.dumps(e, separators=(",", ":")) + "," for e in self.start(rank)) if not sender.seq else ""
            )
            bodies.append((head[:-1] + ',"events":[' + start + packed + extra + "]}").encode())
        sender.seq += 1
        return gzip_body(bodies[0] if len(bodies) == 1 else protocol.bulk_body(bodies))

    def grads_event(self, first: int, last: int) -> Any:
        from agents import protocol

        grads = self.grads.get((first, last))
        if grads is None:
            rows = [fingerprints(s, self.args.buckets) for s in range(first, last + 1)]
            grads = self.grads[first, last] = protocol.Grads.pack(first, rows, ts=time.time())
        return grads

    def rank_grads(self, rank: int, first: int, last: int) -> Any:
        """`rank`'s grads event: the agreed one, or the diverging rank's own at the diverging step."""
        from agents import protocol

        agreed = self.grads_event(first, last)
        if self.divergence is None or rank != self.divergence.rank or not first <= self.divergence.step <= last:
            return agreed
        rows = [fingerprints(s, self.args.buckets) for s in range(first, last + 1)]
        rows[self.divergence.step - first][0] ^= 1  # one bucket off by one bit, as a flipped bit would be
        return protocol.Grads.pack(first, rows, ts=agreed.ts)

    def packed_body(self, sender: Sender, first: int, last: int) -> bytes:
        """A rack's batches as its relays send them: one `protocol.Packed` body, the agreed `grads` event
        once for all of them (what `agents.agreement.pack` makes of batches that hold the same event).
        The first, and one that holds a diverging rank's step, are `agreement.pack`'s own: each rank's
        rank_start alone, the compile events once, the diverging rank's grads alone."""
        from agents import agreement, protocol

        seq = sender.seq
        sender.seq += 1
        run = protocol.RunInfo(**self.run)
        divergence = self.divergence
        diverging = divergence is not None and divergence.rank in sender.ranks and first <= divergence.step <= last
        extra = self.cadence(sender, first, last)
        if not seq or diverging or extra:
            start = (lambda rank: msgspec.convert(self.start(rank), list[protocol.AnyEvent])) if not seq else None
            return agreement.pack(
                [
                    protocol.Batch(
                        v=1,
                        run=run,
                        rank=rank,
                        session=session,
                        seq=seq,
                        events=[*(start(rank) if start else []), self.rank_grads(rank, first, last), *extra],
                    )
                    for rank, session in zip(sender.ranks, sender.sessions)
                ]
            )
        packed = protocol.Packed(
            v=protocol.PACKED_VERSION,
            runs=[run],
            batches=[
                protocol.PackedBatch(run=0, rank=rank, session=session, seq=seq)
                for rank, session in zip(sender.ranks, sender.sessions)
            ],
            agreed=[protocol.Agreed(event=self.grads_event(first, last), of=[(0, len(sender.ranks) - 1)])],
        )
        return protocol.encode(packed)

    def end_body(self, sender: Sender) -> bytes:
        """Its ranks' rank_end, as each agent sends when its process exits: alike on every rank, so a
        rack's travel once (`agreement.pack`)."""
        from agents import agreement, protocol

        seq, sender.seq = sender.seq, sender.seq + 1
        run, now = protocol.RunInfo(**self.run), time.time()
        batches = [
            protocol.Batch(v=1, run=run, rank=rank, session=session, seq=seq, events=[protocol.RankEnd(ts=now)])
            for rank, session in zip(sender.ranks, sender.sessions)
        ]
        if self.args.nodes_per_rack:
            return gzip_body(agreement.pack(batches))
        bodies = [protocol.encode(batch) for batch in batches]
        return gzip_body(bodies[0] if len(bodies) == 1 else protocol.bulk_body(bodies))

    def check_packing(self) -> None:
        """`packed_body` is what the relays' own packing gives for the same batches."""
        from agents import agreement, protocol

        sender = Sender(self.senders[0].ranks, self.senders[0].sessions, seq=1, next_heartbeat=float("inf"))
        grads = self.grads_event(1, 1)  # a step of no weight fingerprints (`cadence`)
        batches = [
            protocol.Batch(v=1, run=protocol.RunInfo(**self.run), rank=rank, session=session, seq=1, events=[grads])
            for rank, session in zip(sender.ranks, sender.sessions)
        ]
        if self.packed_body(sender, 1, 1) != agreement.pack(batches):
            raise AssertionError("the simulated rack body differs from agents.agreement.pack's")

    async def post(self, body: bytes) -> tuple[int, dict, bytes]:
        """One request on a connection of its own, as `agents.transport.exchange` (urllib) sends every
        agent's and relay's: the server's processes take each request as they are free to accept it
        (a connection kept per rack would pin a rack to one process for the whole job)."""
        async with self.slots:
            writer = None
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), HTTP_TIMEOUT)
                path = "/api/v1/ingest" if len(self.senders[0].ranks) == 1 else "/api/v1/ingest/bulk"
                writer.write(
                    (
                        f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {self.token}\r\n"
                        f"Content-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: {len(body)}\r\n"
                        "Connection: close\r\n\r\n"
                    ).encode()
                    + body
                )
                return await asyncio.wait_for(_response(reader), HTTP_TIMEOUT)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, IndexError):  # a torn answer too
                return 0, {}, b""
            finally:
                if writer is not None:
                    writer.close()

    async def agent(self, sender: Sender, until: float) -> None:
        """The transport's loop: at each flush, queue the new steps; send the backlog, oldest first."""
        while True:
            now = time.time()
            if now >= until + self.args.drain:
                return
            last = min(self.step_now(now), self.step_now(until))
            if last > sender.sent_through:
                sender.backlog.append((self.body(sender, sender.sent_through + 1, last), sender.sent_through + 1, last))
                sender.sent_through = last
            if now >= until and not sender.ended and not self.args.abandon:
                sender.backlog.append((self.end_body(sender), sender.sent_through + 1, sender.sent_through))
                sender.ended = True
            if now >= until and not sender.backlog:
                return  # the job ended and everything it made was accepted
            while sender.backlog and time.time() >= sender.not_before:
                body, first, last_step = sender.backlog[0]
                sent = time.perf_counter()
                status, headers, payload = await self.post(body)
                if status == 200:
                    self.tally.round_trips.append(time.perf_counter() - sent)
                    self.accepted(sender, first, last_step, payload)
                    sender.backlog.pop(0)
                    sender.failures = 0
                else:
                    self.tally.refused[status or "timeout"] = self.tally.refused.get(status or "timeout", 0) + 1
                    sender.failures += 1
                    retry = headers.get("retry-after")
                    delay = (
                        float(retry)
                        if retry
                        else min(BACKOFF_MAX, BACKOFF_BASE * 2 ** (sender.failures - 1)) * random.uniform(0.5, 1)
                    )
                    sender.not_before = time.time() + delay
            interval = sender.interval
            wait = interval - time.time() % interval
            await asyncio.sleep(wait if wait >= interval / 10 else wait + interval)

    def accepted(self, sender: Sender, first: int, last: int, payload: bytes) -> None:
        now = time.time()
        answer = msgspec.json.decode(payload)
        reply = answer["results"][0] if "results" in answer else answer
        asked = reply.get("flush_interval_s")
        sender.asked = max(sender.asked, float(asked or 0.5))
        sender.interval = transport.kept_interval(0.5, min(60.0, float(asked)) if asked else None, self.args.step_time)
        self.tally.ok += 1
        self.tally.rank_steps += (last - first + 1) * len(sender.ranks)
        for step in range(first, last + 1):
            got = self.tally.acked.setdefault(step, [0, 0.0])
            got[0] += len(sender.ranks)
            got[1] = now

    def run_for(self, seconds: float, clients: int = 1) -> None:
        """The job, its senders split over `clients` processes sharing its clock: at 100,000 ranks one
        process nears a core at a step's burst, and its own lateness would be in the figures."""
        self.t0 = time.time()
        if clients <= 1:
            self._part(seconds, 0, 1)
            return
        context = multiprocessing.get_context("fork")  # the children share this process's simulation
        pipes = [context.Pipe(duplex=False) for _ in range(clients)]
        children = [
            context.Process(target=self._child, args=(seconds, i, clients, send)) for i, (_, send) in enumerate(pipes)
        ]
        for child in children:
            child.start()
        parts = [receive.recv() for receive, _ in pipes]
        for child in children:
            child.join()
        self.client_core = 0.0
        for i, (tally, intervals, core) in enumerate(parts):
            self._merge(tally)
            for sender, (interval, asked) in zip(self.senders[i::clients], intervals):
                sender.interval, sender.asked = interval, asked
            self.client_core += core
        self.clients = clients

    def _child(self, seconds: float, part: int, parts: int, pipe: Any) -> None:
        self._part(seconds, part, parts)
        senders = self.senders[part::parts]
        pipe.send((self.tally, [(s.interval, s.asked) for s in senders], self.client_core))

    def _part(self, seconds: float, part: int, parts: int) -> None:
        """Every `parts`-th sender from `part` on, in this process, on the job's clock (`t0`)."""
        cpu = time.process_time()
        asyncio.run(self._agents(self.senders[part::parts], self.t0 + seconds))
        self.client_core = (time.process_time() - cpu) / max(time.time() - self.t0, 1e-9)

    async def _agents(self, senders: list[Sender], until: float) -> None:
        self.slots = asyncio.Semaphore(self.args.connections or len(senders))
        place = {id(sender): i for i, sender in enumerate(self.senders)}
        for sender in senders:  # racks heartbeat spread over the interval, by their place in the whole job
            sender.next_heartbeat = self.t0 + self.args.heartbeat * place[id(sender)] / len(self.senders)
        await asyncio.gather(*(self.agent(s, until) for s in senders))

    def _merge(self, other: Tally) -> None:
        t = self.tally
        t.ok += other.ok
        t.rank_steps += other.rank_steps
        t.round_trips += other.round_trips
        for status, n in other.refused.items():
            t.refused[status] = t.refused.get(status, 0) + n
        for step, (n, at) in other.acked.items():
            got = t.acked.setdefault(step, [0, 0.0])
            got[0] += n
            got[1] = max(got[1], at)

    def settled(self, seconds: float) -> str:
        """When each step of the second half had its grad slot settled after the step ended."""
        from dashboard.ledger.models import GradSlot

        ends = {
            step: self.t0 + (step + 1) * self.args.step_time for step in range(self.step_now(self.t0 + seconds) + 1)
        }
        rows = GradSlot.objects.filter(run__key=self.run["key"], group="ddp").values_list("step", "settled_at")
        at = {step: settled.timestamp() for step, settled in rows if settled is not None}
        half = [step for step in ends if step * self.args.step_time >= seconds / 2]
        late = [at[step] - ends[step] for step in half if step in at]
        q = statistics.quantiles(late, n=100) if len(late) >= 2 else [float("nan")] * 99
        self.figures.update(settled_p50=q[49], settled_p99=q[98])
        return (
            f"; grad slot settled after its step's end: p50 {q[49]:.1f} s, p99 {q[98]:.1f} s over {len(late)} steps"
            f" ({len(half) - len(late)} not settled)"
        )

    def paged(self, receiver: Receiver, wait: float = 30.0) -> str:
        """How long after the diverging step's end its page reached the webhook, and whether the run has
        exactly one incident, rooted at the diverging rank."""
        from bench.fault_matrix import incidents_of

        assert self.divergence is not None
        key, end = self.run["key"], self.t0 + (self.divergence.step + 1) * self.args.step_time
        while receiver.first_page_at(key) is None and time.time() < end + wait:
            time.sleep(0.2)
        arrived = receiver.first_page_at(key)
        page = float("nan") if arrived is None else arrived - end
        roots = [(i["root"] or {}).get("ranks") for i in incidents_of(key)]
        right = roots == [[self.divergence.rank]]
        self.figures.update(page=page, right=float(right))
        return (
            f"; rank {self.divergence.rank}'s gradients differ at step {self.divergence.step}: its slot settled"
            f" {self.settled_after(self.divergence.step):.1f} s and paged {page:.1f} s"
            f" after the step's end, {len(roots)} incident(s) rooted at {roots} ({'right' if right else 'WRONG'})"
        )

    def settled_after(self, step: int) -> float:
        """Seconds from the step's end to its grad slot's settle (nan: not settled): the rest of a page's
        time is the alert's way to the webhook."""
        from dashboard.ledger.models import GradSlot

        at = GradSlot.objects.filter(run__key=self.run["key"], group="ddp", step=step).values_list(
            "settled_at", flat=True
        )
        settled = next(iter(at), None)
        end = self.t0 + (step + 1) * self.args.step_time
        return float("nan") if settled is None else settled.timestamp() - end

    def report(self, seconds: float, receiver: Receiver | None, split: str = "") -> tuple[str, str, str]:
        t = self.tally
        made = (self.step_now(self.t0 + seconds) + 1) * self.ranks
        late = [
            got[1] - (self.t0 + (step + 1) * self.args.step_time)
            for step, got in sorted(t.acked.items())
            if got[0] >= self.ranks and step * self.args.step_time >= seconds / 2
        ]
        refused = sum(t.refused.values())
        first = t.acked.get(0, [0, float("nan")])
        start = first[1] - (self.t0 + self.args.step_time) if first[0] >= self.ranks else float("nan")
        intervals = sorted(s.interval for s in self.senders)
        asked = max(s.asked for s in self.senders)
        q = statistics.quantiles(late, n=100) if len(late) >= 2 else [float("nan")] * 99
        trips = statistics.quantiles(t.round_trips, n=100) if len(t.round_trips) >= 2 else [float("nan")] * 99
        self.figures = {
            "accepted": t.rank_steps / seconds,
            "share": t.rank_steps / max(made, 1),
            "p50": q[49],
            "p99": q[98],
            "start": start,
        }
        form = form_of(self.args)
        return (
            f"{self.ranks:,} ranks, {form}",
            f"{t.rank_steps / seconds:,.0f}",
            f"rank-steps/s accepted of {made / seconds:,.0f} made ({t.rank_steps / max(made, 1):.1%} of them accepted"
            f" within {self.args.drain:g} s of the job's end); {(t.ok + refused) / seconds:,.0f} requests/s;"
            f" retried {refused / max(t.ok + refused, 1):.1%} ({', '.join(f'{k}: {v}' for k, v in sorted(t.refused.items(), key=str)) or 'none'});"
            f" flush interval at end {intervals[0]:g}-{intervals[-1]:g} s (median {statistics.median(intervals):g},"
            f" the server asked up to {asked:g} s);"
            f" step fully accepted after its end: p50 {q[49]:.1f} s, p99 {q[98]:.1f} s over {len(late)} steps"
            f" ({len([s for s, g in t.acked.items() if g[0] < self.ranks])} steps not yet complete); the first step,"
            f" with every rank's start (its rank_start and {len(self.compiles)} compile events), {start:.1f} s;"
            f" the simulated agents' {self.clients} process(es) used {self.client_core:.0%} of a core;"
            f" a request's round trip to its 200 p50 {trips[49]:.2f} s, p99 {trips[98]:.2f} s"
            + split
            + (self.settled(seconds) if self.args.celery else "")
            + (self.paged(receiver) if receiver is not None else ""),
        )


SPLIT = {
    "lockstep_ingest_queued_seconds": "waited for a group writer",
    "lockstep_ingest_group_write_seconds": "a group's write",
}
SHED = "lockstep_ingest_shed_total"  # requests refused 503 for load, by why (`ingest.metrics.SHED`)


class Served(NamedTuple):
    """What ingest's /metrics says of the requests so far, summed over its processes."""

    histograms: dict[str, dict[float, float]]  # name -> {bucket bound: observations at most it} (+inf: all)
    shed: dict[str, float]  # why -> requests shed for load


def served(url: str) -> Served:
    """Ingest's histograms of where a request's server time goes, and its count of requests shed."""
    from bench.ingest import scrape

    found = Served({name: {} for name in [*SPLIT, "lockstep_ingest_group_batches"]}, {})
    for key, value in scrape(url).items():
        name, _, labels = key.partition("_bucket{")
        if name in found.histograms:
            found.histograms[name][float(labels.split('le="')[1].split('"')[0])] = value
        elif key.startswith(SHED + "{"):
            found.shed[key.split('why="')[1].split('"')[0]] = value
    return found


def server_split(before: Served, after: Served) -> str:
    """Where the job's requests spent their server time, from the histograms' growth over the job: the
    bucket bound each percentile falls under; and how many were shed for load, by why."""

    def bound(counts: dict[float, float], q: float) -> str:
        total = counts.get(float("inf"), 0.0)
        for le in sorted(counts):
            if total and counts[le] >= q * total:
                return f"<= {le:g}" if le != float("inf") else "above the last bucket"
        return "none"

    def grown(name: str) -> dict[float, float]:
        return {le: n - before.histograms[name].get(le, 0.0) for le, n in after.histograms[name].items()}

    parts = [
        f"{what} p50 {bound(grown(name), 0.5)} s, p99 {bound(grown(name), 0.99)} s" for name, what in SPLIT.items()
    ]
    parts.append(f"batches per group p50 {bound(grown('lockstep_ingest_group_batches'), 0.5).removesuffix(' s')}")
    shed = {why: int(after.shed.get(why, 0.0) - before.shed.get(why, 0.0)) for why in ("waited", "queue_full")}
    parts.append(
        f"shed for load {shed['waited']} after waiting past the bound, {shed['queue_full']} with the queue full"
    )
    return "; in the server (its /metrics): " + ", ".join(parts)


def summary(ranks: int, figures: list[dict[str, float]]) -> tuple[str, str, str]:
    """Median (min-max) over the repeats of one job size."""

    def spread(key: str, fmt: str) -> str:
        values = [f[key] for f in figures]
        return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"

    return (
        f"{ranks:,} ranks, median of {len(figures)}",
        spread("accepted", ",.0f"),
        f"rank-steps/s accepted, median (min-max); share of the steps made {spread('share', '.1%')};"
        f" step fully accepted after its end: p50 {spread('p50', '.2f')} s, p99 {spread('p99', '.2f')} s;"
        f" the first step (every rank's start with it) {spread('start', '.2f')} s"
        + (
            f"; grad slot settled after its step's end: p50 {spread('settled_p50', '.2f')} s,"
            f" p99 {spread('settled_p99', '.2f')} s"
            if "settled_p99" in figures[0]
            else ""
        )
        + (
            f"; a diverging rank paged after its step's end {spread('page', '.2f')} s,"
            f" rooted at the right rank in {sum(int(f['right']) for f in figures)} of {len(figures)}"
            if "page" in figures[0]
            else ""
        ),
    )


def cadence_of(args: argparse.Namespace) -> str:
    """What the simulated ranks send besides their gradients, in words."""
    beats = f"a heartbeat and a progress sample every {args.heartbeat:g} s" if args.heartbeat else "no heartbeats"
    weights = f"weight fingerprints every {args.param_every} steps" if args.param_every else "no weight fingerprints"
    return f"{beats}, {weights}"


def form_of(args: argparse.Namespace) -> str:
    """How the simulated ranks reach the server, in words."""
    if args.nodes_per_rack:
        return f"relay tree ({args.ranks_per_request} ranks per node, {args.nodes_per_rack} nodes per rack, packed)"
    return "direct" if args.ranks_per_request == 1 else f"{args.ranks_per_request} ranks/request"


async def _response(reader) -> tuple[int, dict, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    return status, headers, await reader.readexactly(int(headers.get("content-length", "0")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="1024,4096,16384", help="job sizes, comma separated")
    parser.add_argument("--seconds", type=float, default=40.0, help="how long each job runs")
    parser.add_argument(
        "--step-time", type=float, default=0.25, help="seconds per training step (2 steps per 0.5 s flush)"
    )
    parser.add_argument("--ranks-per-request", type=int, default=1, help="8: node relays")
    parser.add_argument(
        "--nodes-per-rack", type=int, default=0, help="32: a rack relay above the node relays, packed bodies (0: none)"
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs of each job size (a summary row when more than one)"
    )
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument(
        "--heartbeat",
        type=float,
        default=5.0,
        help="seconds between a rank's heartbeats, each with a progress sample (the agent's default; 0: none)",
    )
    parser.add_argument(
        "--param-every",
        type=int,
        default=50,
        help="steps between a rank's weight fingerprints (the agent's default; 0: none)",
    )
    parser.add_argument(
        "--drain",
        type=float,
        default=15.0,
        help="seconds the agents go on sending what is not accepted yet once the job stops making steps",
    )
    parser.add_argument("--ingest", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument(
        "--connections",
        type=int,
        default=0,
        help="requests the agents have in flight at once (0: one each, as real agents have: the queue forms in the server)",
    )
    parser.add_argument(
        "--abandon",
        action="store_true",
        help="the job's ranks stop without a rank_end, as a job the scheduler kills (default: each sends its rank_end)",
    )
    parser.add_argument(
        "--clients",
        type=int,
        default=1,
        help="processes the simulated agents are split over (a 100,000-rank job's one process nears a core)",
    )
    parser.add_argument(
        "--celery", type=int, default=0, help="Celery worker processes (with beat) settling the slots (0: ingest alone)"
    )
    parser.add_argument(
        "--diverge",
        action="store_true",
        help="one rank's gradients differ at the middle step: time its page (needs --celery and --nodes-per-rack)",
    )
    args = parser.parse_args(argv)
    if args.diverge and not (args.celery and args.nodes_per_rack):
        parser.error("--diverge needs --celery (the workers that page) and --nodes-per-rack (the packed form)")
    if args.ranks_per_request * max(args.nodes_per_rack, 1) > 256:
        parser.error("a request's batches must fit one bulk request (protocol.MAX_BATCHES_PER_REQUEST = 256)")

    env = dict(bench_env(), LOCKSTEP_SINKS_ALLOW_PRIVATE="1")  # the webhook receiver listens on 127.0.0.1
    fresh_database(env)
    setup_django(env)
    from django.conf import settings

    from dashboard.tenancy.models import Project, ProjectToken

    project = Project.objects.create(name="bench")
    token = ProjectToken.issue(project)
    receiver = Receiver() if args.diverge else None
    if receiver is not None:
        configure_webhook(project, receiver.url)
    servers = start_servers(env, args.ingest, 0)
    if args.celery:
        servers.add_worker(env, "lockstep-bench-servers", args.celery)
    rows = []
    loads = [os.getloadavg()[0]]
    try:
        for ranks in [int(r) for r in args.ranks.split(",")]:
            figures = []
            for _ in range(args.repeats):
                simulation = Simulation(args, servers.url, token, ranks)
                if args.nodes_per_rack:
                    simulation.check_packing()
                before = served(servers.url)
                simulation.run_for(args.seconds, args.clients)
                split = server_split(before, served(servers.url))
                rows.append(simulation.report(args.seconds, receiver, split))
                print(" | ".join(rows[-1]), flush=True)  # a long run's progress, and what a killed one got
                figures.append(simulation.figures)
                loads.append(os.getloadavg()[0])
            if args.repeats > 1:
                rows.append(summary(ranks, figures))
    finally:
        servers.stop()
        if receiver is not None:
            receiver.server.shutdown()
    rows.append(
        (
            "load average (1 min)",
            f"{min(loads):.1f}-{max(loads):.1f}",
            f"{os.cpu_count()} CPUs shared by the simulated agents, the servers, PostgreSQL (and whatever else runs)",
        )
    )
    conns = (
        f"{args.connections} requests in flight at most" if args.connections else "one request in flight per agent"
    ) + ", a connection each"
    report(
        f"ingest_simulation ({args.ranks_per_request} rank(s) per request)"
        if not args.nodes_per_rack
        else f"ingest_simulation (relay tree, {args.ranks_per_request} x {args.nodes_per_rack}, {os.cpu_count()} cores)",
        argv,
        f"a job at real cadence: {args.step_time:g} s per step, {args.seconds:g} s per job, {args.ingest} ingest processes"
        f" of {settings.LOCKSTEP_INGEST_WRITERS} group writers each, {args.celery} Celery worker processes, {conns},"
        f" {args.buckets} buckets, {cadence_of(args)}",
        rows,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
