"""P1 at the agents' real cadence: rank-steps/s and requests/s at 1, 2 and 8 steps per batch.

Agents flush every 0.5 s (LOCKSTEP_FLUSH_INTERVAL), so a live job sends batches of a few steps,
and the server's cost is per request, not per event. For every batch size and both request
forms (each rank posting its own batch; a node relay's bulk of 8 ranks, as `agents/relay.py`
forwards them) this sends waves of one batch per rank (all ranks at the same steps, as in a
job), from several client processes with many connections (a job is many agents), and prints
rank-steps/s, requests/s and the server's CPU per request. As an agent and a relay do, a sender
(a rank, or a relay's 8 ranks) has one request out at a time: each sender keeps to one connection,
which sends its next batch once the last one is answered (a sender's two batches in flight at once
would make their transactions wait on each other's rows, which no real job does). The raw binary COPY of the same
events (one row per rank-step, same table, same run of the script) is the anchor, measured
before and after the HTTP cells.

`--server label=PATH` (repeatable) runs the ingest processes of another source tree, e.g. the
code before a change (`git archive <commit> | tar -x -C /tmp/before`), each against a database of
its own made by that tree's migrations (a server measured on another version's schema would be
measured with indexes it does not have, or without those it needs); the variants are interleaved
A B B A per repetition, so a load that drifts over the run favours neither. Every cell is a fresh
run whose ranks have sent one untimed batch first.

    python -m bench ingest_cadence                                   # this tree
    python -m bench ingest_cadence --server today=/tmp/before --server new=. --repeat 2
    python -m bench ingest_cadence --sizes 256 --modes relay         # the upper bound row
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

try:
    import uvloop  # uvicorn[standard] brings it: the cheaper client loop, when present
except ImportError:
    uvloop = None  # type: ignore[assignment]  # absent: asyncio's own loop

from bench.common import ROOT, bench_env, fingerprints, fresh_database, gzip_body, raw_copy, setup_django, start_servers
from bench.results import report

RELAY_RANKS = 8  # ranks per node, per bulk request


def cell_requests(ranks: int, steps_per_batch: int, per: int, waves: int, buckets: int) -> list[tuple[list, int]]:
    """[(requests of a wave, rank-steps of the wave)] for waves+1 waves; the first is the untimed warm-up.
    A request is (path, gzip body, rank-steps, sender): the sender is the rank, or the relay's index."""
    from agents import protocol

    run = {"key": f"cadence-{uuid.uuid4().hex[:10]}", "world_size": ranks, "name": "cadence bench"}
    sessions = [str(uuid.uuid4()) for _ in range(ranks)]
    out = []
    for wave in range(waves + 1):
        first = wave * steps_per_batch
        rows = [fingerprints(first + i, buckets) for i in range(steps_per_batch)]
        packed = protocol.encode(protocol.Grads.pack(first, rows, ts=time.time())).decode()
        bodies = []
        for r in range(ranks):
            head = json.dumps(
                {"v": 1, "run": run, "rank": r, "session": sessions[r], "seq": wave}, separators=(",", ":")
            )
            bodies.append((head[:-1] + ',"events":[' + packed + "]}").encode())
        if per == 1:
            requests = [("/api/v1/ingest", gzip_body(b), steps_per_batch, r) for r, b in enumerate(bodies)]
        else:
            requests = [
                (
                    "/api/v1/ingest/bulk",
                    gzip_body(protocol.bulk_body(bodies[i : i + per])),
                    steps_per_batch * per,
                    i // per,
                )
                for i in range(0, ranks, per)
            ]
        out.append((requests, steps_per_batch * ranks))
    return out


def _client(url: str, token: str, requests: list, connections: int, clients: int, go, results) -> None:
    """One client process: up to `connections` keep-alive connections on one event loop, each sending
    the requests of its senders in order. Raw HTTP/1.1 over asyncio streams, each request's bytes
    built before the clock starts: a thread per connection with http.client cost more CPU per request
    than the server it measured, on the same two cores."""
    host, port = url.removeprefix("http://").split(":")
    head = (
        "POST {path} HTTP/1.1\r\nHost: " + f"{host}:{port}\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: {length}\r\n\r\n"
    )
    queues: dict[int, list] = {}
    for path, body, rank_steps, sender in reversed(requests):
        queues.setdefault(sender // clients % connections, []).append(
            (head.format(path=path, length=len(body)).encode() + body, rank_steps)
        )
    tally: dict[str, Any] = {"ok": 0, "rank_steps": 0, "failures": []}

    async def connection(todo: list) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        while todo:
            request, rank_steps = todo.pop()
            writer.write(request)
            status, payload = await _response(reader)
            if status == 200:
                tally["ok"] += 1
                tally["rank_steps"] += rank_steps
            else:
                tally["failures"].append(f"{status} {payload[:120]!r}")
                writer.close()  # the server may close after a refusal: a fresh connection
                reader, writer = await asyncio.open_connection(host, int(port))
        writer.close()

    async def drain() -> None:
        await asyncio.gather(*(connection(todo) for todo in queues.values()))

    go.wait()
    started = time.time()
    (uvloop.run if uvloop else asyncio.run)(drain())
    results.put((started, time.time(), tally))


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """(status, body) of one HTTP/1.1 response with a Content-Length (0: the connection closed)."""
    line = await reader.readline()
    if not line:
        return 0, b"connection closed"
    status, length = int(line.split()[1]), 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


def send(url: str, token: str, requests: list, clients: int, connections: int) -> tuple[dict, float]:
    """Send `requests` from `clients` processes (each `connections` connections); (tally, wall seconds)."""
    ctx = multiprocessing.get_context("fork")
    go, results = ctx.Event(), ctx.Queue()
    shares = [
        [r for r in requests if r[3] % clients == i] for i in range(clients)
    ]  # a sender's requests stay in wave order
    procs = [
        ctx.Process(target=_client, args=(url, token, share, connections, clients, go, results)) for share in shares
    ]
    for p in procs:
        p.start()
    go.set()
    answers = [results.get() for _ in procs]
    for p in procs:
        p.join()
    total = {
        "ok": sum(a[2]["ok"] for a in answers),
        "rank_steps": sum(a[2]["rank_steps"] for a in answers),
        "failures": [f for a in answers for f in a[2]["failures"]],
    }
    return total, max(a[1] for a in answers) - min(a[0] for a in answers)


def _token(env: dict, root: Path) -> str:
    """A project token in the database of the tree at `root`, made by that tree (`manage.py createtoken`)."""
    out = subprocess.run(
        [sys.executable, "manage.py", "createtoken", "bench"],
        cwd=root,
        env=dict(env, PYTHONPATH=str(root)),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.strip().splitlines()[-1]


def anchor(ranks: int, buckets: int, steps: int = 64) -> float:
    """Rows/s of one binary COPY of `steps` steps of every rank, a row per rank-step (`common.raw_copy`)."""
    from agents import protocol

    packed = {
        b: protocol.encode(
            protocol.Grads.pack(8 * b, [fingerprints(8 * b + i, buckets) for i in range(8)], ts=time.time())
        )
        for b in range(steps // 8)
    }
    _, rows, seconds = raw_copy(packed, ranks, f"anchor-{uuid.uuid4().hex[:8]}")
    return rows / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--sizes", default="1,2,8", help="steps per batch, comma separated")
    parser.add_argument(
        "--modes", default="direct,relay", help="direct (one rank per request) and/or relay (8 per request)"
    )
    parser.add_argument(
        "--requests", type=int, default=3072, help="timed requests per direct cell (relay cells: a third)"
    )
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument("--ingest", type=int, default=2, help="uvicorn worker processes per server")
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument(
        "--connections",
        type=int,
        default=128,
        help="connections per client process (a 1024-rank job opens one per agent: 1024)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="repetitions (each A B B A over the servers)")
    parser.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="LABEL=PATH",
        help="a source tree to run the ingest processes from (default: this one)",
    )
    args = parser.parse_args(argv)
    servers_of = [tuple(s.split("=", 1)) for s in args.server] or [("this tree", str(ROOT))]

    env = bench_env()
    fresh_database(env)
    setup_django(env)
    from dashboard.tenancy.models import Project

    Project.objects.create(name="bench")  # the raw COPY anchor's
    started, tokens = {}, {}
    for i, (label, path) in enumerate(servers_of):
        root = Path(path).resolve()
        own = bench_env(f"lockstep_bench_server{i}")
        fresh_database(own, root)
        tokens[label] = _token(own, root)
        started[label] = start_servers(own, args.ingest, 0, root)
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    results: dict[tuple, list[tuple[float, float, float, int]]] = {}
    anchors = [anchor(args.ranks, args.buckets)]
    loads = [os.getloadavg()[0]]
    try:
        for _ in range(args.repeat):
            order = [label for label, _ in servers_of]
            order = order + order[::-1] if len(order) > 1 else order
            for size in sizes:
                for mode in modes:
                    per = 1 if mode == "direct" else RELAY_RANKS
                    per_wave = args.ranks // per
                    target = args.requests if per == 1 else args.requests // 3
                    waves = max(2, -(-target // per_wave)) if size < 256 else 1
                    for label in order:
                        servers = started[label]
                        built = cell_requests(args.ranks, size, per, waves, args.buckets)
                        token = tokens[label]  # in that server's own database
                        warm, _ = send(servers.url, token, built[0][0], args.clients, args.connections)
                        timed = [r for wave, _ in built[1:] for r in wave]
                        cpu = servers.ingest_cpu_seconds()
                        tally, wall = send(servers.url, token, timed, args.clients, args.connections)
                        cpu = servers.ingest_cpu_seconds() - cpu
                        failed = len(tally["failures"]) + len(warm["failures"])
                        results.setdefault((size, mode, label), []).append(
                            (tally["rank_steps"] / wall, tally["ok"] / wall, 1000 * cpu / len(timed), failed)
                        )
                        print(
                            f"{label}, {size} step(s)/batch, {mode}: {tally['rank_steps'] / wall:,.0f} rank-steps/s,"
                            f" {tally['ok'] / wall:,.0f} requests/s, {failed} failed"
                            + (f", e.g. {(warm['failures'] + tally['failures'])[0]}" if failed else ""),
                            flush=True,
                        )
                        loads.append(os.getloadavg()[0])
    finally:
        for servers in started.values():
            servers.stop()
    anchors.append(anchor(args.ranks, args.buckets))
    rows = []
    copy_rate = statistics.median(anchors)
    for size in sizes:
        for mode in modes:
            for label, _ in servers_of:
                got = results[(size, mode, label)]
                steps_s = [g[0] for g in got]
                rows.append(
                    (
                        f"{size} step(s)/batch, {mode}, {label}",
                        f"{statistics.median(steps_s):,.0f}",
                        f"rank-steps/s (runs {' / '.join(f'{s:,.0f}' for s in steps_s)});"
                        f" {statistics.median(g[1] for g in got):,.0f} requests/s;"
                        f" {statistics.median(g[2] for g in got):.2f} ms server CPU/request;"
                        f" {statistics.median(steps_s) / copy_rate:.3f}x COPY; failed {sum(g[3] for g in got)}",
                    )
                )
    rows.append(
        (
            "raw binary COPY rows/s",
            f"{copy_rate:,.0f}",
            f"same events, a row per rank-step, one COPY, same table (before / after: {anchors[0]:,.0f} / {anchors[1]:,.0f})",
        )
    )
    rows.append(
        (
            "load average (1 min)",
            f"{min(loads):.1f}-{max(loads):.1f}",
            f"{os.cpu_count()} CPUs shared by clients, servers, PostgreSQL (and whatever else runs)",
        )
    )
    report(
        "ingest_cadence",
        argv,
        f"ingest at real cadence: {args.ranks} ranks, {args.buckets} buckets, {args.ingest} ingest processes per server,"
        f" {args.clients}x{args.connections} connections, {args.repeat} repetition(s)",
        rows,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
