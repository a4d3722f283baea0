"""Shared by the ingest benchmarks: a dedicated database, the server processes, simulated ranks.

The bench database (`lockstep_bench` next to DATABASE_URL's, dropped and migrated at start) and
Redis database 10 are its own, so a run never touches the suite's or the demo's data.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse, urlunparse

import msgspec

from agents import procstat
from dashboard.devstack.processes import server_command

if TYPE_CHECKING:
    from django.db.models import Model
    from django.test import Client

    from dashboard.tenancy.models import Run

ROOT = Path(__file__).resolve().parent.parent
RECORDING = Path(__file__).resolve().parent / "data" / "agent-events.json"


def python_speed() -> float:
    """CPU seconds of a fixed pure-Python loop (ten million additions): how fast this machine runs
    Python at the moment, printed beside figures that Python bounds so runs of different days compare."""
    start = time.process_time()
    total = 0
    for i in range(10_000_000):
        total += i
    return time.process_time() - start


def bench_env(db_name: str = "lockstep_bench") -> dict:
    base = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/lockstep")
    parts = urlparse(base)
    env = dict(os.environ)
    env.update(
        DATABASE_URL=urlunparse(parts._replace(path="/" + db_name)),
        REDIS_URL=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/10"),
        DJANGO_SETTINGS_MODULE="dashboard.settings",
        PYTHONPATH=str(ROOT),
        LOCKSTEP_RATE_LIMIT="0",
        LOCKSTEP_METRICS_PUBLIC="1",  # the bench reads /metrics without a token
        LOG_LEVEL="WARNING",
        LOCKSTEP_DB_POOL="4",
        SECRET_KEY=os.environ.get("SECRET_KEY", "lockstep-bench-only"),
    )
    return env


def fresh_database(env: dict, root: Path = ROOT) -> None:
    """Drop and recreate the bench database, then migrate it with the migrations of the tree at `root`."""
    import psycopg

    url = urlparse(env["DATABASE_URL"])
    name = url.path.lstrip("/")
    with psycopg.connect(urlunparse(url._replace(path="/postgres")), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"],
        cwd=root,
        env=dict(env, PYTHONPATH=str(root)),
        check=True,
        stderr=subprocess.DEVNULL,
    )
    import redis

    redis.Redis.from_url(env["REDIS_URL"]).flushdb()


def setup_django(env: dict) -> None:
    os.environ.update(
        {
            k: env[k]
            for k in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "LOCKSTEP_RATE_LIMIT", "SECRET_KEY")
        }
    )
    import django

    django.setup()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Servers:
    """N ingest server processes (`dashboard.serve --workers N`) and M Celery workers, as process groups."""

    url: str
    procs: list[subprocess.Popen]
    folders: list[Path] = field(default_factory=list)  # removed by `stop`

    def add_worker(self, env: dict, name: str, concurrency: int = 1, root: Path = ROOT) -> None:
        """The server's Celery worker with its beat, as production runs it (`worker_command`), stopped
        with the servers: its beat schedule in a folder of its own, its log `<tmp>/<name>.log`."""
        from dashboard.devstack.processes import worker_command

        beat = Path(tempfile.mkdtemp(prefix=f"{name}-beat-"))
        self.folders.append(beat)
        self.procs.append(
            subprocess.Popen(
                worker_command("--schedule", str(beat / "beat-schedule"), concurrency=concurrency),
                cwd=root,
                env=dict(env, PYTHONPATH=str(root)),
                stdout=open(Path(tempfile.gettempdir()) / f"{name}.log", "ab"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    def stop(self) -> None:
        from dashboard.devstack.processes import stop_groups

        stop_groups(self.procs)
        for folder in self.folders:
            shutil.rmtree(folder, ignore_errors=True)

    def ingest_cpu_seconds(self) -> float:
        """CPU time (user + system) used so far by the uvicorn processes: per request, it compares
        two versions of the server even on a machine whose other load changes the wall clock."""
        from dashboard.devstack.processes import descendants

        tick = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in [self.procs[0].pid, *descendants(self.procs[0].pid)]:
            fields = procstat.fields(pid)
            if fields:
                total += int(fields[procstat.UTIME]) + int(fields[procstat.STIME])
        return total / tick


def postgres_cpu_seconds(database: str) -> float:
    """CPU time (user + system) used so far by the PostgreSQL backends serving `database`, from /proc
    (PostgreSQL on this machine). Why backends only: they do a group's work (its statements, COPY,
    and the WAL flush of its commit); the cluster's shared processes (WAL writer, checkpointer) also
    serve other databases of the machine. Connections must stay open between two readings (the
    servers' pool does): a backend that exits takes its time with it."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid, fields in procstat.every():
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("latin-1")
        except OSError:
            continue
        if title.startswith("postgres:") and f" {database} " in title:
            total += int(fields[procstat.UTIME]) + int(fields[procstat.STIME])
    return total / tick


def start_servers(env: dict, ingest: int, celery: int, root: Path = ROOT) -> Servers:
    """`root`: the source tree the processes run (another checkout compares two versions side by side)."""
    port = free_port()
    env = dict(env, PROMETHEUS_MULTIPROC_DIR=tempfile.mkdtemp(prefix="lockstep-prom-"), PYTHONPATH=str(root))
    log = open(Path(tempfile.gettempdir()) / "lockstep-bench-servers.log", "ab")
    procs = [
        subprocess.Popen(
            server_command("127.0.0.1", port, "--workers", str(ingest), "--no-access-log"),
            cwd=root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    ]
    if celery:
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "dashboard",
                    "worker",
                    "--concurrency",
                    str(celery),
                    "--loglevel",
                    "warning",
                ],
                cwd=root,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    servers = Servers(f"http://127.0.0.1:{port}", procs)
    _wait_http(port)
    return servers


def _wait_http(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("ingest server did not come up; see /tmp/lockstep-bench-servers.log")


def recording() -> list[dict]:
    """Events the real agent sent (bench/ingest_record.py); the template of every simulated rank."""
    return json.loads(RECORDING.read_text())["events"]


def compile_burst(recorded: list[dict], rank: int) -> list[dict]:
    """The recorded start of a rank: its compile (and graph-break) events, plus a rank_start."""
    start = {
        "t": "rank_start",
        "host": f"node{rank // 8}",
        "pid": 1000 + rank,
        "local_rank": rank % 8,
        "device": f"cuda:{rank % 8}",
        "versions": {"torch": "2.13.0"},
    }
    return [start] + [e for e in recorded if e["t"] in ("compile", "graph_break")]


def fingerprints(step: int, buckets: int) -> list[int]:
    """Replicas agree: every rank gets the same fingerprints for a step."""
    rng = random.Random(step)
    return [rng.getrandbits(64) for _ in range(buckets)]


def gzip_body(body: dict | bytes) -> bytes:
    raw = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
    return gzip.compress(raw, compresslevel=6)


class AlertClock(threading.Thread):
    """When each alert of a kind first reaches a project's websocket (`/ws/alerts/` as a member), by
    `key(alert)`: the latency benches stop their clocks on it."""

    def __init__(self, url: str, session: str, kind: str, key: Callable[[dict], Hashable]) -> None:
        from websockets.sync.client import connect

        super().__init__(daemon=True)
        self.kind, self.key = kind, key
        self.ws = connect(
            url.replace("http", "ws") + "/ws/alerts/",
            open_timeout=10,
            additional_headers={"Cookie": f"sessionid={session}", "Origin": url},
        )
        self.seen: dict[Hashable, float] = {}

    def run(self) -> None:
        try:
            for raw in self.ws:
                alert = json.loads(raw).get("alert") or {}
                if alert.get("kind") == self.kind and self.key(alert) not in self.seen:
                    self.seen[self.key(alert)] = time.perf_counter()
        except Exception:
            return


def project_member(name: str) -> tuple[str, str]:
    """(project token, session cookie of a member) for a new project `name`: the websocket clients
    of the latency benches need a logged-in member, as the browser has."""
    from django.contrib.auth.models import User
    from django.test import Client

    from dashboard.tenancy.models import Project, ProjectToken

    project = Project.objects.create(name=name)
    user = User.objects.create_user(name)
    project.members.add(user)
    client = Client()
    client.force_login(user)
    return ProjectToken.issue(project), client.cookies["sessionid"].value


def raw_copy(packed: dict, ranks: int, run_key: str, together: int = 1) -> tuple[int, int, float]:
    """The same grad events (another run), pre-encoded, through one binary COPY: the ceiling.

    `together=1`: one row per rank-step, nothing shared (the P1 anchor: the events as rows).
    `together=8`: the rows ingest stores for 8 ranks per request (agreeing ranks share a row).
    Returns (rank-steps, rows, seconds).
    """
    from django.db import connection

    from agents import protocol
    from dashboard.evidence import binary_copy, partitions
    from dashboard.tenancy.models import Project, Run

    project = Project.objects.get(name="bench")
    run = Run.objects.create(project=project, key=f"{run_key}-rawcopy-{together}", world_size=ranks)
    now = datetime.now(UTC)
    partitions.ensure_around(now)
    rows = [binary_copy.HEADER]
    rank_steps = 0
    for body in packed.values():
        events = binary_copy.GradEvents([msgspec.json.decode(body, type=protocol.Grads)], [])
        for first in range(0, ranks, together):
            rows += binary_copy.grad_copy(
                [(run.id, rank, events) for rank in range(first, min(first + together, ranks))], now
            )
        rank_steps += events.rows * ranks
    rows.append(binary_copy.TRAILER)
    data = b"".join(rows)
    cols = ", ".join(f'"{c}"' for c in binary_copy.GRAD_COLUMNS)
    connection.ensure_connection()
    raw = connection.connection
    started = time.perf_counter()
    with (
        raw.transaction(),
        raw.cursor() as cur,
        cur.copy(f"COPY evidence_gradreport ({cols}) FROM STDIN (FORMAT BINARY)") as copy,
    ):
        for i in range(0, len(data), 1 << 20):
            copy.write(data[i : i + (1 << 20)])
    return rank_steps, len(rows) - 2, time.perf_counter() - started


def timed_get(client, url: str, n: int) -> list[float]:
    """Milliseconds of `n` GETs of `url` through a Django test client, sorted, after one warm-up
    (connections, template cache)."""
    client.get(url)
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        response = client.get(url)
        samples.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200, (url, response.status_code, response.content[:300])
    return sorted(samples)


def configure_in_process(db: str) -> None:
    """Django set up in this process against database `db` (made and migrated when missing), for
    benches that time views through the test client."""
    base = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/lockstep")
    os.environ["DATABASE_URL"] = base.rsplit("/", 1)[0] + f"/{db}"
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/9")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    os.environ.setdefault("SECRET_KEY", "lockstep-bench-only")
    os.environ["ALLOWED_HOSTS"] = "testserver"  # the in-process test client
    os.environ.setdefault("LOCKSTEP_METRICS_PUBLIC", "1")  # bench/metrics.py reads /metrics without a token
    import psycopg

    with psycopg.connect(base.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db]).fetchone():
            conn.execute(f"CREATE DATABASE {db}")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def run_size_parser(
    description: str, n: int, rebuild_help: str = "regenerate the run even if it exists"
) -> argparse.ArgumentParser:
    """The flags of the benches that time the pages of one big run: its size, the timed calls, a fresh fill."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("-n", type=int, default=n)
    parser.add_argument("--rebuild", action="store_true", help=rebuild_help)
    return parser


def populate_once(key: str, rebuild: bool, fill: Callable[[], None]) -> None:
    """Fill run `key` only when it is missing or `rebuild` asks: filling a big run takes minutes, timing it seconds."""
    from dashboard.tenancy.models import Run

    if rebuild or not Run.objects.filter(key=key).exists():
        start = time.perf_counter()
        fill()
        print(f"populated {key} in {time.perf_counter() - start:.1f} s", file=sys.stderr)


def fresh_run(key: str, ranks: int, steps: int, torch_version: str, name: str | None = None) -> Run:
    """Run `key` of the "bench" project, made anew (an older one and its rows deleted), its last step `steps - 1`."""
    from dashboard.tenancy.models import Project, Run

    project, _ = Project.objects.get_or_create(name="bench")
    Run.objects.filter(project=project, key=key).delete()
    return Run.objects.create(
        project=project,
        key=key,
        name=name or f"bench {ranks}x{steps}",
        world_size=ranks,
        torch_version=torch_version,
        last_step=steps - 1,
    )


def today_partitions() -> None:
    """Today's partitions of the raw evidence tables, which the bench's bulk inserts land in."""
    from django.utils import timezone

    from dashboard.evidence import partitions

    partitions.ensure([timezone.now().date()])


def finished_ranks(run: Run, info: dict[str, Any]) -> None:
    """Every rank of `run` ended ok at its last step, 8 to a host, each with the same rank_start `info`."""
    from dashboard.tenancy.models import Rank

    Rank.objects.bulk_create(
        Rank(run=run, rank=r, host=f"node{r // 8}", pid=1000 + r, info=info, status="ok", last_step=run.last_step)
        for r in range(run.world_size)
    )


def graph_breaks(run: Run, t0: float, frame: str) -> None:
    """Four graph breaks of `frame` per rank at step 0 (a `print` in the model), from `t0` + 30 s, one a second."""
    from django.db import connection

    from dashboard.evidence.models import GraphBreakEvent

    with connection.cursor() as cur:
        cur.execute(
            f"""
            INSERT INTO {GraphBreakEvent._meta.db_table} (run_id, rank, frame, reason, step, ts)
            SELECT %(run)s, r, %(frame)s, 'call_function print', 0, to_timestamp(%(t0)s + 30 + b)
            FROM generate_series(0, %(ranks)s - 1) r, generate_series(0, 3) b
            """,
            {"run": run.id, "ranks": run.world_size, "t0": t0, "frame": frame},
        )


def analyze(*models: type[Model], vacuum: bool = False) -> None:
    """Fresh planner statistics for the tables a bench filled, so the timed queries get the plans a live
    database has; `vacuum` also clears the rows a rebuild left dead."""
    from django.db import connection

    command = "VACUUM ANALYZE" if vacuum else "ANALYZE"
    with connection.cursor() as cur:
        for model in models:
            cur.execute(f"{command} {model._meta.db_table}")


def member_client() -> Client:
    """A test client logged in as a member of the "bench" project, as the browser of a reader is."""
    from django.contrib.auth.models import User
    from django.test import Client

    from dashboard.tenancy.models import Project

    user, _ = User.objects.get_or_create(username="bench")
    Project.objects.get(name="bench").members.add(user)
    client = Client()
    client.force_login(user)
    return client


def p90(samples: list[float]) -> float:
    """The 90th percentile of sorted `samples` (the highest one when there are fewer than ten)."""
    return samples[min(len(samples) - 1, int(len(samples) * 0.9))]
