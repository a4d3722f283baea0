"""P1 and P7: grad events over HTTP into PostgreSQL, against a raw binary COPY of the same rows.

Simulates N ranks (default 1024) from the events the real agent recorded (bench/data/): each rank
first sends its compile burst, then steady batches of `--steps-per-batch` steps in the compact
`grads` form (plus the recorded per-step `step` event with --step-events). All ranks advance
together, so grad slots fill and settle as in a real job. The steady batches of 8 ranks (one
node) go up together in one bulk request, as the node relay (`python -m agents relay`) sends
them; `--ranks-per-request 1` has every rank post its own. Bodies are built and gzipped before
the clock starts; the clock covers the steady phase only. Then the same grad events are written
by one raw binary COPY, one row per rank-step, into the same table, same indexes, same run of the
script. Ingest itself stores a request's agreeing ranks in shared rows; the table says how many.

    python -m bench ingest                          # P1/P7 as in the README: 1024 ranks x 1024 steps, 256 steps
                                                    # per batch, 8 ranks per request, 2 ingest processes, 8 connections
    python -m bench ingest --ranks-per-request 1    # no relay: one request per rank and batch
    python -m bench ingest --ingest 2 --celery 2    # the docs/scale-out.md run

Ingest goes through the agents' door (ingest/door.py), as in production.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field

from bench.common import (
    bench_env,
    compile_burst,
    fingerprints,
    fresh_database,
    gzip_body,
    raw_copy,
    recording,
    setup_django,
    start_servers,
)
from bench.results import report

PENDING_GRAD = 'lockstep_slots_pending{kind="grad"}'
MLFLOW_ANCHOR = "MLflow tracking server log_batch: 1.6k-3.3k points/s on this kind of machine"


@dataclass
class Request:
    body: bytes
    rank_steps: int
    path: str = "/api/v1/ingest"


@dataclass
class Tally:
    sent: int = 0
    rank_steps: int = 0
    wire_bytes: int = 0
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def build(args, recorded: list[dict]) -> tuple[list[Request], list[Request], dict]:
    """Compile-burst requests, steady requests (step-major across ranks), and the packed events per batch."""
    from agents import protocol

    run = {"key": f"bench-{uuid.uuid4().hex[:8]}", "world_size": args.ranks, "name": "ingest bench"}
    step_template = next((e for e in recorded if e["t"] == "step"), {"t": "step", "loss": 0.25, "step_time": 0.05})
    n_batches = args.steps // args.steps_per_batch
    packed = {}
    for b in range(n_batches):
        first = b * args.steps_per_batch
        rows = [fingerprints(first + i, args.buckets) for i in range(args.steps_per_batch)]
        packed[b] = protocol.encode(protocol.Grads.pack(first, rows, ts=time.time())).decode()
    sessions = [str(uuid.uuid4()) for _ in range(args.ranks)]
    burst = [
        Request(
            gzip_body(
                {"v": 1, "run": run, "rank": r, "session": sessions[r], "seq": 0, "events": compile_burst(recorded, r)}
            ),
            0,
        )
        for r in range(args.ranks)
    ]
    steady = []
    per = args.ranks_per_request
    for b in range(n_batches):
        first = b * args.steps_per_batch
        extra = ""
        if args.step_events:
            extra = "," + ",".join(
                json.dumps(dict(step_template, step=first + i, ts=time.time()), separators=(",", ":"))
                for i in range(args.steps_per_batch)
            )
        bodies = []
        for r in range(args.ranks):
            head = json.dumps(
                {"v": 1, "run": run, "rank": r, "session": sessions[r], "seq": b + 1}, separators=(",", ":")
            )
            bodies.append((head[:-1] + ',"events":[' + packed[b] + extra + "]}").encode())
        if per == 1:
            steady += [Request(gzip_body(body), args.steps_per_batch) for body in bodies]
        else:  # what a node relay (agents/relay.py) sends: its ranks' batches, byte for byte, in one bulk body
            steady += [
                Request(
                    gzip_body(protocol.bulk_body(bodies[i : i + per])),
                    args.steps_per_batch * len(bodies[i : i + per]),
                    "/api/v1/ingest/bulk",
                )
                for i in range(0, len(bodies), per)
            ]
    return burst, steady, {"run": run["key"], "packed": packed}


def send_all(url: str, token: str, requests: list[Request], connections: int) -> tuple[Tally, float]:
    host, port = url.removeprefix("http://").split(":")
    work: queue.Queue = queue.Queue()
    for item in requests:
        work.put(item)
    tally = Tally()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Content-Encoding": "gzip"}
    header_bytes = sum(len(k) + len(v) + 4 for k, v in headers.items()) + 60

    def worker() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        while True:
            try:
                item = work.get_nowait()
            except queue.Empty:
                break
            conn.request("POST", item.path, item.body, headers)
            response = conn.getresponse()
            payload = response.read()
            with tally.lock:
                tally.sent += 1
                tally.wire_bytes += len(item.body) + header_bytes + len(f"POST {item.path} HTTP/1.1\r\n")
                if response.status == 200:
                    tally.rank_steps += item.rank_steps
                else:
                    tally.failures.append(f"{response.status} {payload[:200]!r}")
        conn.close()

    threads = [threading.Thread(target=worker) for _ in range(connections)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tally, time.perf_counter() - started


def scrape(url: str) -> dict[str, float]:
    import urllib.request

    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def drain_time(url: str, timeout: float = 120) -> float | None:
    """Seconds until no grad slot waits to settle (None: not within the timeout)."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if scrape(url).get(PENDING_GRAD, 0) == 0:
            return time.perf_counter() - start
        time.sleep(0.1)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument(
        "--steps", type=int, default=1024, help="steady steps per rank (the clock runs for several seconds)"
    )
    parser.add_argument("--steps-per-batch", type=int, default=256)
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument("--ingest", type=int, default=2, help="ASGI worker processes")
    parser.add_argument("--celery", type=int, default=0, help="Celery worker processes settling slots meanwhile")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument(
        "--ranks-per-request",
        type=int,
        default=8,
        help="batches of this many ranks per request, as a node relay sends them (bulk endpoint; 1: each rank posts its own)",
    )
    parser.add_argument("--step-events", action="store_true", help="also send the recorded per-step `step` event")
    args = parser.parse_args(argv)

    env = bench_env()
    fresh_database(env)
    setup_django(env)
    from dashboard.tenancy.models import Project, ProjectToken

    token = ProjectToken.issue(Project.objects.create(name="bench"))
    recorded = recording()
    burst, steady, built = build(args, recorded)
    servers = start_servers(env, args.ingest, args.celery)
    try:
        burst_tally, burst_s = send_all(servers.url, token, burst, args.connections)
        load_before, cpu_before = os.getloadavg()[0], servers.ingest_cpu_seconds()
        tally, elapsed = send_all(servers.url, token, steady, args.connections)
        load_after, cpu_used = os.getloadavg()[0], servers.ingest_cpu_seconds() - cpu_before
        after = scrape(servers.url)
        drained = drain_time(servers.url) if args.celery else None
    finally:
        servers.stop()
    from dashboard.evidence.models import GradReport

    stored_rows = GradReport.objects.filter(run__key=built["run"]).count()
    _, rows, copy_s = raw_copy(built["packed"], args.ranks, built["run"])
    shared_steps, shared_rows, shared_s = (
        raw_copy(built["packed"], args.ranks, built["run"], args.ranks_per_request)
        if args.ranks_per_request > 1
        else (rows, rows, copy_s)
    )
    http_rate, copy_rate, shared_rate = tally.rank_steps / elapsed, rows / copy_s, shared_steps / shared_s
    failures = burst_tally.failures + tally.failures
    report(
        f"ingest ({args.ranks_per_request} rank(s) per request)",
        argv,
        f"ingest bench: {args.ranks} ranks x {args.steps} steps, {args.buckets} buckets, {args.steps_per_batch} steps/batch,"
        f" {args.ingest} ingest processes, {args.celery} Celery workers, {args.connections} connections,"
        f" {args.ranks_per_request} rank(s) per request",
        [
            (
                "compile burst",
                f"{burst_s:.2f} s",
                f"{len(burst)} batches, {burst_tally.sent - len(burst_tally.failures)} accepted",
            ),
            (
                "P1 grad events/s over HTTP",
                f"{http_rate:,.0f}",
                f"{tally.rank_steps:,} rank-steps in {elapsed:.2f} s (target >= 200,000)",
            ),
            ("raw binary COPY rows/s", f"{copy_rate:,.0f}", f"{rows:,} same events, a row each, one COPY, same table"),
            ("P1 HTTP / raw COPY", f"{http_rate / copy_rate:.2f}x", "target >= 0.5x"),
            (
                "grad rows stored per rank-step",
                f"{stored_rows / max(tally.rank_steps, 1):.3f}",
                f"{stored_rows:,} rows: agreeing ranks of one request share a row",
            ),
            (
                "raw COPY of rows as stored",
                f"{shared_rate:,.0f}",
                f"rank-steps/s: {shared_rows:,} rows as ingest shares them, one COPY (HTTP at {http_rate / shared_rate:.2f}x)",
            ),
            (
                "server CPU per request",
                f"{1000 * cpu_used / max(len(steady), 1):.2f} ms",
                f"uvicorn processes, user + system, {len(steady):,} requests (steadier than the clock on a loaded machine)",
            ),
            (
                "P7 wire bytes per rank-step",
                f"{tally.wire_bytes / max(tally.rank_steps, 1):.1f}",
                "gzip body + HTTP request headers (target <= 200)",
            ),
            ("failed requests", str(len(failures)), failures[0] if failures else ""),
            ("slots pending at end", f"{after.get(PENDING_GRAD, 0):.0f}", "grad slots not yet settled"),
            ("settle queue depth at end", f"{after.get('lockstep_settle_queue_depth', 0):.0f}", "Celery tasks waiting"),
            (
                "all grad slots settled",
                "-" if drained is None else f"{drained:.2f} s",
                "after the last batch was accepted (detection keeping up: about one batch wave)",
            ),
            ("anchor", "1.6k-3.3k/s", MLFLOW_ANCHOR),
            (
                "load average (1 min)",
                f"{load_before:.1f} -> {load_after:.1f}",
                f"{os.cpu_count()} CPUs shared by client, server, PostgreSQL (and whatever else runs)",
            ),
        ],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
