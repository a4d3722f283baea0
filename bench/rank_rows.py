"""What a rank's row costs ingest and detection when its start facts hold a real model's parameter
layout: kept inside the row (PostgreSQL's default: a value moves out of line only once the row
passes about 2 kB, and a layout of a few kB compresses to 1-1.5 kB) or out of line (the rank
table's own `toast_tuple_target`, `dashboard/tenancy/migrations/0002_rank_facts.py`).

    python -m bench rank_rows [--ranks 20000] [--params 150] [--rounds 10] [--repeats 3]

Two tables made like the rank table (`CREATE TABLE ... LIKE`, its fill factor), one with the rank
table's storage options and one without, in the bench's own database; `--ranks` rows each, every
row's start facts a layout of `--params` names and their buckets. Times, median (min-max) over
`--repeats`: `--rounds` rounds of every rank's row updated in groups of 256 rows, as ingest's upsert
does at each batch (the start facts kept, progress and `last_seen` moved), one transaction per
group; and a scan of the rows' ages, as the sweep's liveness does. Also the heap's size after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import psycopg

from bench import results

BENCH_DB = "lockstep_bench_rank_rows"
GROUP = 256
LAYOUT = (
    "jsonb_build_object('params', (SELECT jsonb_agg('ddp:model.layers.' || i || '.weight')"
    " FROM generate_series(1, %(params)s) i), 'buckets', (SELECT jsonb_agg(jsonb_build_array(i))"
    " FROM generate_series(0, %(params)s - 1) i))"
)
FACTS = "jsonb_build_object('host', 'node' || r / 8, 'device', 'cuda:' || r %% 8)"


def database() -> str:
    base = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/lockstep").rsplit("/", 1)[0]
    with psycopg.connect(base + "/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {BENCH_DB}")
        conn.execute(f"CREATE DATABASE {BENCH_DB}")
    return base + "/" + BENCH_DB


def rank_table_options() -> list[str]:
    """The rank table's storage options as the migrations leave them (made in a scratch database)."""
    from bench import common

    common.configure_in_process(BENCH_DB + "_schema")
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT reloptions FROM pg_class WHERE relname = 'tenancy_rank'")
        ((options,),) = cur.fetchall()
        return list(options)


def fill(conn: psycopg.Connection, table: str, options: list[str], ranks: int, params: int) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.execute(
        f"CREATE TABLE {table} (rank int PRIMARY KEY, info jsonb NOT NULL, facts jsonb NOT NULL,"
        f" last_step bigint, last_seen timestamptz NOT NULL) WITH ({', '.join(options)})"
    )
    conn.execute(
        f"INSERT INTO {table} SELECT r, {LAYOUT} || {FACTS}, {FACTS}, 0, now()"
        " FROM generate_series(0, %(ranks)s - 1) r",
        {"ranks": ranks, "params": params},
    )
    conn.execute(f"VACUUM ANALYZE {table}")


def updates(conn: psycopg.Connection, table: str, ranks: int, rounds: int) -> float:
    start = time.perf_counter()
    for step in range(rounds):
        for first in range(0, ranks, GROUP):
            with conn.transaction():
                conn.execute(
                    f"UPDATE {table} t SET info = t.info, facts = t.facts, last_step = %s, last_seen = now()"
                    " WHERE rank >= %s AND rank < %s",
                    [step, first, first + GROUP],
                )
    return time.perf_counter() - start


def scan(conn: psycopg.Connection, table: str) -> float:
    start = time.perf_counter()
    conn.execute(f"SELECT count(*), min(EXTRACT(EPOCH FROM now() - last_seen)) FROM {table}").fetchone()
    return time.perf_counter() - start


def spread(samples: list[float], scale: float, unit: str) -> str:
    values = [s * scale for s in samples]
    return f"{statistics.median(values):.1f} {unit} ({min(values):.1f}-{max(values):.1f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=20_000)
    parser.add_argument("--params", type=int, default=150, help="parameter names in each rank's start facts")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    forms = {"in the row": ["fillfactor=50"], "out of line": rank_table_options()}
    rows: list[tuple[str, str, str]] = []
    with psycopg.connect(database(), autocommit=True) as conn:
        for name, options in forms.items():
            table = "rows_" + name.replace(" ", "_")
            timed, scans, heap = [], [], ""
            for _ in range(args.repeats):
                fill(conn, table, options, args.ranks, args.params)
                timed.append(updates(conn, table, args.ranks, args.rounds) / (args.ranks * args.rounds))
                scans.append(scan(conn, table))
                (heap,) = conn.execute(f"SELECT pg_size_pretty(pg_relation_size('{table}'))").fetchall()[0]
            detail = f"{', '.join(options)}; heap {heap} after {args.rounds} rounds"
            rows.append((f"{name}: update a rank's row", spread(timed, 1e6, "us"), detail))
            rows.append((f"{name}: scan the ranks' ages", spread(scans, 1e3, "ms"), f"{args.ranks:,} rows"))
    results.report(
        "rank_rows",
        argv,
        f"a rank's row with a {args.params}-parameter layout in its start facts, {args.ranks:,} ranks, "
        f"updated in groups of {GROUP}; median (min-max) of {args.repeats}",
        rows,
    )
    return 0
