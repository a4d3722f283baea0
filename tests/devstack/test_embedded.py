"""The embedded PostgreSQL + Redis stack (dashboard/devstack/embedded.py), without Django.

One scenario, in order: concurrent cold start from three processes, real round trips with psycopg
and redis-py, fast reuse (in-process and from a fresh process), stop, restart with data intact.
The fixture stops both servers (and SIGKILLs any leftover) even when an assertion fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import psycopg
import pytest
import redis

EMBEDDED_PY = Path(__file__).resolve().parents[2] / "dashboard" / "devstack" / "embedded.py"
REUSE_BUDGET_S = 0.1


def _load_embedded() -> ModuleType:
    """Load embedded.py by path: importing the `dashboard` package would pull in Celery/Django."""
    spec = importlib.util.spec_from_file_location("lockstep_embedded", EMBEDDED_PY)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses need the module registered while executing
    spec.loader.exec_module(module)
    return module


embedded = _load_embedded()

# Runs in a separate interpreter: calls both functions, prints URLs and how long the calls took.
CHILD = """
import importlib.util, json, sys, time
from pathlib import Path
spec = importlib.util.spec_from_file_location("lockstep_embedded", sys.argv[1])
mod = importlib.util.module_from_spec(spec); sys.modules[spec.name] = mod; spec.loader.exec_module(mod)
data_dir = Path(sys.argv[2])
start = time.perf_counter()
urls = [mod.postgres_url(data_dir), mod.redis_url(data_dir)]
print(json.dumps({"urls": urls, "elapsed": time.perf_counter() - start}))
"""


def _spawn_child(data_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(EMBEDDED_PY), str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _child_result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _alive(pid: int) -> bool:
    """Running and not a zombie (this container's PID 1 does not reap orphaned daemons)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in {"Z", "X"}


def _server_pids(data_dir: Path) -> dict[str, int]:
    """pids recorded by the servers themselves (postmaster.pid first line, redis pidfile)."""
    pids = {}
    for name, path in (("postgres", data_dir / "pg" / "postmaster.pid"), ("redis", data_dir / "redis" / "redis.pid")):
        try:
            pids[name] = int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return pids


def _count_processes(needle: bytes) -> int:
    """Live processes whose command line contains `needle`."""
    count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes() and _alive(int(entry.name)):
                count += 1
        except OSError:
            continue
    return count


def _redis_port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _timed(func, *args):
    start = time.perf_counter()
    result = func(*args)
    return result, time.perf_counter() - start


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """A fresh data folder; both servers are stopped afterwards whatever happened."""
    path = tmp_path / "data"
    pids: dict[str, int] = {}
    try:
        yield path
    finally:
        pids = _server_pids(path)
        try:
            embedded.stop(path)
        finally:
            for pid in pids.values():  # last resort, so no daemon outlives the test run
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)


def test_embedded_stack_lifecycle(data_dir: Path) -> None:
    # Cold start raced by three processes: the fcntl locks let exactly one start each server.
    children = [_spawn_child(data_dir) for _ in range(2)]
    (pg_url, pg_cold_s) = _timed(embedded.postgres_url, data_dir)
    (r_url, redis_cold_s) = _timed(embedded.redis_url, data_dir)
    for child in children:
        assert _child_result(child)["urls"] == [pg_url, r_url]
    pgdata = (data_dir / "pg").resolve()
    port = _redis_port(r_url)
    assert pg_url == f"postgresql://postgres@/lockstep?host={pgdata}&port=5432"
    assert r_url.startswith("redis://127.0.0.1:") and r_url.endswith("/0") and port != 6379
    assert _count_processes(b"\0-D\0" + str(pgdata).encode() + b"\0") == 1
    assert _count_processes(f"redis-server 127.0.0.1:{port}".encode()) == 1
    print(f"\ncold start (racing 2 other processes): postgres {pg_cold_s:.3f}s, redis {redis_cold_s:.3f}s")

    assert embedded.running(data_dir) == ["postgresql", "redis"]

    # Real round trips.
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("lockstep",)
        conn.execute("CREATE TABLE kept (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO kept VALUES (1, 'survives restarts')")
        assert conn.execute("SELECT note FROM kept WHERE id = 1").fetchone() == ("survives restarts",)
    client = redis.Redis.from_url(r_url)
    client.set("lockstep:kept", "broker state")
    assert client.get("lockstep:kept") == b"broker state"
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    client.close()

    # Reuse is a liveness check, not a restart: same URLs, same pids, fast.
    pids_before = _server_pids(data_dir)
    (pg_again, pg_reuse_s) = _timed(embedded.postgres_url, data_dir)
    (r_again, redis_reuse_s) = _timed(embedded.redis_url, data_dir)
    assert (pg_again, r_again) == (pg_url, r_url)
    assert _server_pids(data_dir) == pids_before
    assert pg_reuse_s < REUSE_BUDGET_S and redis_reuse_s < REUSE_BUDGET_S
    warm_child = _child_result(_spawn_child(data_dir))
    assert warm_child["urls"] == [pg_url, r_url]
    assert warm_child["elapsed"] < REUSE_BUDGET_S
    print(
        f"reuse: postgres {pg_reuse_s * 1000:.1f}ms, redis {redis_reuse_s * 1000:.1f}ms, "
        f"both from a fresh process {warm_child['elapsed'] * 1000:.1f}ms"
    )

    # Stop: processes gone, socket and port closed; a second stop is a no-op.
    (_, stop_s) = _timed(embedded.stop, data_dir)
    embedded.stop(data_dir)
    assert not any(_alive(pid) for pid in pids_before.values())
    assert embedded.running(data_dir) == []
    assert not _port_open(port)
    assert not (pgdata / ".s.PGSQL.5432").exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(pg_url, connect_timeout=2).close()
    print(f"stop both: {stop_s:.3f}s")

    # Restart: same URLs (the redis port is recorded), data intact (PGDATA, appendonly.aof).
    (pg_restart, pg_restart_s) = _timed(embedded.postgres_url, data_dir)
    (r_restart, redis_restart_s) = _timed(embedded.redis_url, data_dir)
    assert (pg_restart, r_restart) == (pg_url, r_url)
    assert _server_pids(data_dir) != pids_before
    with psycopg.connect(pg_restart) as conn:
        assert conn.execute("SELECT note FROM kept WHERE id = 1").fetchone() == ("survives restarts",)
    client = redis.Redis.from_url(r_restart)
    assert client.get("lockstep:kept") == b"broker state"
    client.close()
    print(f"restart: postgres {pg_restart_s:.3f}s, redis {redis_restart_s:.3f}s")


def test_redis_start_failure_is_a_clear_error(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "_redis_server_binary", lambda: "/bin/false")
    with pytest.raises(RuntimeError, match=r"redis-server failed to start .*log: .*redis\.log"):
        embedded.redis_url(data_dir)


def test_stop_when_nothing_runs_is_a_no_op(data_dir: Path) -> None:
    embedded.stop(data_dir)


def test_stale_pid_files_after_a_crash_are_ignored(data_dir: Path) -> None:
    """After kill -9 or a reboot the pid files may name recycled pids (here: this test process)."""
    pg_url = embedded.postgres_url(data_dir)
    r_url = embedded.redis_url(data_dir)
    postmaster_pid = data_dir / "pg" / "postmaster.pid"
    lines = postmaster_pid.read_text().splitlines(keepends=True)
    embedded.stop(data_dir)
    postmaster_pid.write_text(f"{os.getpid()}\n" + "".join(lines[1:]))
    (data_dir / "redis" / "redis.pid").write_text(f"{os.getpid()}\n")

    embedded.stop(data_dir)  # must not signal the recycled pid (it would kill pytest)
    assert (embedded.postgres_url(data_dir), embedded.redis_url(data_dir)) == (pg_url, r_url)
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert redis.Redis.from_url(r_url).ping()


def test_redis_takes_the_port_asked_for_and_refuses_a_taken_one(data_dir: Path) -> None:
    """LOCKSTEP_REDIS_PORT (manage.py up passes it here): a second stack on one machine picks its own."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(
            RuntimeError, match=rf"127\.0\.0\.1:{taken.getsockname()[1]} \(LOCKSTEP_REDIS_PORT\) is taken"
        ):
            embedded.redis_url(data_dir, taken.getsockname()[1])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        wanted = probe.getsockname()[1]
    assert embedded.redis_url(data_dir, wanted) == f"redis://127.0.0.1:{wanted}/0"
    assert redis.Redis(port=wanted).ping()
