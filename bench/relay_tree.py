"""What each level of a relay tree costs per rank-step, on the wire, in the server, in PostgreSQL.

Ranks at one step a second, each flushing one batch per step (one compact `grads` event; all
replicas agree, as healthy DDP ranks do). Two forms of the same job, each `--repeats` times on a
fresh run:

- **node relays**: today's tree of one level. A node relay sends its ranks' batches as they came
  (`protocol.Bulk`, version 1), every node on its own connection at once, so the server's group
  commit takes many nodes' requests together as it does in production.
- **tree**: node relays pack their ranks' batches (`protocol.Packed`: the agreement once) and send
  them to a rack relay, which packs its nodes' batches into one request per rack per step.

The relays' packing is `agents.agreement`'s own, run in this process: the bytes per level are
those the relays send (gzip level 6, as `agents.relay`); only the server's requests go over HTTP,
to real uvicorn workers, PostgreSQL and Redis on this machine. Server CPU is the ingest processes'
user + system time; PostgreSQL CPU that of the backends serving the bench's database (its WAL
writer and checkpointer are shared with the machine's other databases, so left out); PostgreSQL's
rows are the rows inserted (counted) and its bytes the growth of every table and index, per
rank-step.

    python -m bench relay_tree --ranks-per-node 8 --nodes-per-rack 32 --racks 2 --steps 20 --repeats 3
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from bench.common import bench_env, fingerprints, fresh_database, postgres_cpu_seconds, setup_django, start_servers
from bench.results import report

LEVELS = ("agent -> node", "node -> rack", "rack -> server", "node -> server")


@dataclass
class Measured:
    """One repeat of one form: wire bytes per level, server CPU, PostgreSQL rows and bytes; all totals."""

    rank_steps: int = 0
    wire: dict[str, int] = field(default_factory=dict)
    requests: int = 0
    cpu_s: float = 0.0
    pg_cpu_s: float = 0.0
    rows: int = 0
    pg_bytes: int = 0


def batch(run: dict, rank: int, step: int, buckets: int) -> bytes:
    """One agent's batch of one step, as it encodes it (so it is packable)."""
    from agents import protocol

    return protocol.encode(
        protocol.Batch(
            v=1,
            run=protocol.RunInfo(**run),
            rank=rank,
            session=f"tree-{run['key']}-{rank:06d}",
            seq=step,
            events=[protocol.Grads.pack(step, [fingerprints(step, buckets)], ts=time.time() + rank * 1e-4)],
        )
    )


def gz(data: bytes) -> bytes:
    return gzip.compress(data, 6)


class Poster:
    """HTTP/1.1 keep-alive connections to the server, one per concurrent sender."""

    def __init__(self, url: str, token: str, senders: int) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.conns = [http.client.HTTPConnection(host, int(port), timeout=30) for _ in range(senders)]
        self.token = token
        self.pool = ThreadPoolExecutor(senders)

    def post_all(self, bodies: list[bytes]) -> None:
        """All bodies at once, one per connection (as many nodes' relays flush together)."""
        for status in self.pool.map(self._post, self.conns, bodies):
            if status != 200:
                raise RuntimeError(f"the server answered {status}")

    def _post(self, conn: http.client.HTTPConnection, body: bytes) -> int:
        conn.request(
            "POST",
            "/api/v1/ingest/bulk",
            body,
            {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
        response = conn.getresponse()
        response.read()
        return response.status


def pg_totals() -> tuple[int, int]:
    """(rows in every table, bytes of every table and index): partitions counted, their parents not."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT c.oid::regclass::text, pg_total_relation_size(c.oid) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'r'"
        )
        tables = cur.fetchall()
        rows = 0
        for name, _ in tables:
            cur.execute(f"SELECT count(*) FROM {name}")
            rows += cur.fetchone()[0]
    return rows, sum(size for _, size in tables)


def run_form(args, servers, token: str, database: str, tree: bool) -> Measured:
    from agents import agreement, protocol

    per_rack = args.ranks_per_node * args.nodes_per_rack
    ranks = per_rack * args.racks
    run = {"key": f"tree-{uuid.uuid4().hex[:8]}", "world_size": ranks}
    m = Measured(wire=dict.fromkeys(LEVELS, 0))
    senders = args.racks if tree else args.racks * args.nodes_per_rack
    poster = Poster(servers.url, token, senders)
    poster.post_all(
        [gz(protocol.bulk_body([batch(run, r, 0, args.buckets)])) for r in range(senders)]
    )  # warm: run, ranks
    time.sleep(0.5)
    rows0, bytes0 = pg_totals()
    cpu0 = servers.ingest_cpu_seconds()
    pg0 = postgres_cpu_seconds(database)  # after pg_totals: its counting is not the server's work
    for step in range(1, args.steps + 1):
        raws = [batch(run, r, step, args.buckets) for r in range(ranks)]
        m.wire["agent -> node"] += sum(len(gz(raw)) for raw in raws)
        nodes = [raws[n : n + args.ranks_per_node] for n in range(0, ranks, args.ranks_per_node)]
        if tree:
            decoded = [[agreement.packable(raw) or raw for raw in node] for node in nodes]
            m.wire["node -> rack"] += sum(len(gz(agreement.pack(node))) for node in decoded)
            racks = [
                [b for node in decoded[k : k + args.nodes_per_rack] for b in node]
                for k in range(0, len(decoded), args.nodes_per_rack)
            ]
            bodies = [gz(agreement.pack(rack)) for rack in racks]
            m.wire["rack -> server"] += sum(map(len, bodies))
        else:
            bodies = [gz(protocol.bulk_body(node)) for node in nodes]
            m.wire["node -> server"] += sum(map(len, bodies))
        poster.post_all(bodies)
        m.requests += len(bodies)
        m.rank_steps += ranks
    m.cpu_s = servers.ingest_cpu_seconds() - cpu0
    m.pg_cpu_s = postgres_cpu_seconds(database) - pg0
    time.sleep(0.5)
    rows1, bytes1 = pg_totals()
    m.rows, m.pg_bytes = rows1 - rows0, bytes1 - bytes0
    return m


def spread(values: list[float], digits: int = 1) -> str:
    """Median and the range over the repeats."""
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def rows_of(form: str, measured: list[Measured]) -> list[tuple[str, str, str]]:
    per = [m.rank_steps for m in measured]
    out = []
    for level in LEVELS:
        if any(m.wire[level] for m in measured):
            out.append(
                (
                    f"{form}: wire {level}",
                    spread([m.wire[level] / n for m, n in zip(measured, per)]),
                    "bytes per rank-step, gzip",
                )
            )
    out += [
        (
            f"{form}: server requests",
            spread([m.requests / n * 1000 for m, n in zip(measured, per)], 2),
            "per 1,000 rank-steps",
        ),
        (
            f"{form}: server CPU",
            spread([m.cpu_s / n * 1e6 for m, n in zip(measured, per)]),
            "us per rank-step (ingest processes)",
        ),
        (
            f"{form}: PostgreSQL CPU",
            spread([m.pg_cpu_s / n * 1e6 for m, n in zip(measured, per)]),
            "us per rank-step (backends of the bench database)",
        ),
        (
            f"{form}: PostgreSQL rows",
            spread([m.rows / n for m, n in zip(measured, per)], 3),
            "rows added per rank-step",
        ),
        (
            f"{form}: PostgreSQL bytes",
            spread([m.pg_bytes / n for m, n in zip(measured, per)]),
            "bytes (tables + indexes) per rank-step",
        ),
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--nodes-per-rack", type=int, default=32)
    parser.add_argument("--racks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="steps per repeat (one batch per rank per step)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument("--ingest", type=int, default=1, help="uvicorn worker processes")
    args = parser.parse_args(argv)
    if args.ranks_per_node * args.nodes_per_rack > 256:
        parser.error("a rack's batches must fit one bulk request (protocol.MAX_BATCHES_PER_REQUEST = 256)")

    env = bench_env()
    fresh_database(env)
    setup_django(env)
    from dashboard.tenancy.models import Project, ProjectToken

    token = ProjectToken.issue(Project.objects.create(name="bench"))
    database = env["DATABASE_URL"].rsplit("/", 1)[1]
    servers = start_servers(env, args.ingest, 0)
    measured: dict[str, list[Measured]] = {"node relays": [], "tree": []}
    try:
        for _ in range(args.repeats):  # the forms alternate, so drift in the machine's load hits both
            measured["node relays"].append(run_form(args, servers, token, database, tree=False))
            measured["tree"].append(run_form(args, servers, token, database, tree=True))
    finally:
        servers.stop()
    rows = rows_of("node relays", measured["node relays"]) + rows_of("tree", measured["tree"])
    ranks = args.ranks_per_node * args.nodes_per_rack * args.racks
    report(
        "relay_tree",
        argv,
        f"{ranks} ranks ({args.ranks_per_node} per node, {args.nodes_per_rack} nodes per rack, {args.racks} racks),"
        f" one step per batch, {args.steps} steps x {args.repeats} repeats per form, {args.buckets} buckets,"
        f" {args.ingest} ingest process(es); median (min-max) over the repeats",
        rows,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
