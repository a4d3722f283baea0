"""A whole job at the agents' real cadence: up to 16,384 simulated ranks against real ingest processes.

Every rank behaves as `agents/transport.py` does: it flushes at multiples of its flush interval on
the wall clock (0.5 s, or the longer one the server's reply asks for: `flush_interval_s`), one
request at a time; a batch the server did not accept (429, 503, a timeout after 10 s) stays in
its backlog (the spool) and is sent again, first, after Retry-After or its backoff. The job's
ranks all complete a step every `--step-time` seconds; a batch carries the steps done since the
last one, as one compact `grads` event. `--ranks-per-request 8` sends a node's 8 batches as one
bulk request, as a node relay forwards them. Bodies are generated; the server (uvicorn workers,
PostgreSQL, Redis) is the real one, on the same machine as this client.

It prints, per job size: the steps the job made and the steps the server took (rank-steps/s),
requests/s, how many requests were answered with something other than 200 (the agents' retry
rate), the flush intervals the agents ended with, and the added detection latency: for each step,
when the server had accepted the last rank's report of it (the moment its grad slot can be
settled) after the step ended, over the second half of the run (percentiles of the steps).

    python -m bench ingest_simulation                                  # 1024, 4096, 16384 ranks, direct
    python -m bench ingest_simulation --ranks 16384 --ranks-per-request 8 --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
import uuid
from dataclasses import dataclass, field

import msgspec

from bench.common import bench_env, fingerprints, fresh_database, gzip_body, setup_django, start_servers
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
    backlog: list[tuple[bytes, int, int]] = field(default_factory=list)  # (body, first step, last step)
    interval: float = 0.5
    not_before: float = 0.0
    failures: int = 0


@dataclass
class Tally:
    ok: int = 0
    refused: dict = field(default_factory=dict)  # status (or "timeout") -> count
    rank_steps: int = 0
    acked: dict = field(default_factory=dict)  # step -> [ranks acked, last ack time]


class Simulation:
    def __init__(self, args, url: str, token: str, ranks: int) -> None:
        self.args, self.token, self.ranks = args, token, ranks
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        self.run = {"key": f"sim-{ranks}-{uuid.uuid4().hex[:8]}", "world_size": ranks, "name": "simulated job"}
        per = args.ranks_per_request
        self.senders = [
            Sender(list(range(r, min(r + per, ranks))), [str(uuid.uuid4()) for _ in range(min(per, ranks - r))])
            for r in range(0, ranks, per)
        ]
        self.tally = Tally()
        self.pool: asyncio.Queue = asyncio.Queue()
        self.packed: dict[tuple[int, int], str] = {}  # every rank reports the same fingerprints for a step
        self.t0 = 0.0

    def step_now(self, now: float) -> int:
        """The last step every rank has completed by `now`."""
        return int((now - self.t0) / self.args.step_time) - 1

    def body(self, sender: Sender, first: int, last: int) -> bytes:
        from agents import protocol

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
            bodies.append((head[:-1] + ',"events":[' + packed + "]}").encode())
        sender.seq += 1
        return gzip_body(bodies[0] if len(bodies) == 1 else protocol.bulk_body(bodies))

    async def post(self, body: bytes) -> tuple[int, dict, bytes]:
        conn = await self.pool.get()
        try:
            if conn is None:
                conn = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), HTTP_TIMEOUT)
            reader, writer = conn
            path = "/api/v1/ingest" if self.args.ranks_per_request == 1 else "/api/v1/ingest/bulk"
            writer.write(
                (
                    f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {self.token}\r\n"
                    f"Content-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: {len(body)}\r\n\r\n"
                ).encode()
                + body
            )
            status, headers, payload = await asyncio.wait_for(_response(reader), HTTP_TIMEOUT)
            self.pool.put_nowait(conn)
            return status, headers, payload
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, IndexError):  # a torn answer too
            if conn is not None:
                conn[1].close()
            self.pool.put_nowait(None)
            return 0, {}, b""

    async def agent(self, sender: Sender, until: float) -> None:
        """The transport's loop: at each flush, queue the new steps; send the backlog, oldest first."""
        while True:
            now = time.time()
            if now >= until:
                return
            last = self.step_now(now)
            if last > sender.sent_through:
                sender.backlog.append((self.body(sender, sender.sent_through + 1, last), sender.sent_through + 1, last))
                sender.sent_through = last
            while sender.backlog and time.time() >= sender.not_before:
                body, first, last_step = sender.backlog[0]
                status, headers, payload = await self.post(body)
                if status == 200:
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
        sender.interval = max(0.5, min(60.0, float(reply.get("flush_interval_s") or 0.5)))
        self.tally.ok += 1
        self.tally.rank_steps += (last - first + 1) * len(sender.ranks)
        for step in range(first, last + 1):
            got = self.tally.acked.setdefault(step, [0, 0.0])
            got[0] += len(sender.ranks)
            got[1] = now

    async def run_for(self, seconds: float) -> None:
        for _ in range(self.args.connections or len(self.senders)):
            self.pool.put_nowait(None)
        self.t0 = time.time()
        until = self.t0 + seconds
        await asyncio.gather(*(self.agent(s, until) for s in self.senders))

    def report(self, seconds: float) -> tuple[str, str, str]:
        t = self.tally
        made = (self.step_now(self.t0 + seconds) + 1) * self.ranks
        late = [
            got[1] - (self.t0 + (step + 1) * self.args.step_time)
            for step, got in sorted(t.acked.items())
            if got[0] >= self.ranks and step * self.args.step_time >= seconds / 2
        ]
        refused = sum(t.refused.values())
        intervals = sorted(s.interval for s in self.senders)
        q = statistics.quantiles(late, n=100) if len(late) >= 2 else [float("nan")] * 99
        form = "direct" if self.args.ranks_per_request == 1 else f"{self.args.ranks_per_request} ranks/request"
        return (
            f"{self.ranks:,} ranks, {form}",
            f"{t.rank_steps / seconds:,.0f}",
            f"rank-steps/s accepted of {made / seconds:,.0f} made; {(t.ok + refused) / seconds:,.0f} requests/s;"
            f" retried {refused / max(t.ok + refused, 1):.1%} ({', '.join(f'{k}: {v}' for k, v in sorted(t.refused.items(), key=str)) or 'none'});"
            f" flush interval at end {intervals[0]:g}-{intervals[-1]:g} s (median {statistics.median(intervals):g});"
            f" step fully accepted after its end: p50 {q[49]:.1f} s, p99 {q[98]:.1f} s over {len(late)} steps"
            f" ({len([s for s, g in t.acked.items() if g[0] < self.ranks])} steps not yet complete)",
        )


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
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument("--ingest", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument(
        "--connections",
        type=int,
        default=0,
        help="client connections the agents share (0: one each, as real agents have: the queue forms in the server)",
    )
    args = parser.parse_args(argv)

    env = bench_env()
    fresh_database(env)
    setup_django(env)
    from dashboard.tenancy.models import Project, ProjectToken

    token = ProjectToken.issue(Project.objects.create(name="bench"))
    servers = start_servers(env, args.ingest, 0)
    rows = []
    loads = [os.getloadavg()[0]]
    try:
        for ranks in [int(r) for r in args.ranks.split(",")]:
            simulation = Simulation(args, servers.url, token, ranks)
            asyncio.run(simulation.run_for(args.seconds))
            rows.append(simulation.report(args.seconds))
            loads.append(os.getloadavg()[0])
    finally:
        servers.stop()
    rows.append(
        (
            "load average (1 min)",
            f"{min(loads):.1f}-{max(loads):.1f}",
            f"{os.cpu_count()} CPUs shared by the simulated agents, the servers, PostgreSQL (and whatever else runs)",
        )
    )
    conns = f"{args.connections} client connections" if args.connections else "one client connection per agent"
    report(
        f"ingest_simulation ({args.ranks_per_request} rank(s) per request)",
        argv,
        f"a job at real cadence: {args.step_time:g} s per step, {args.seconds:g} s per job, {args.ingest} ingest processes,"
        f" {conns}, {args.buckets} buckets",
        rows,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
