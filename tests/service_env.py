"""Loaded with `-p` before pytest-django reads settings: point the suite at real servers.

Defaults are the PostgreSQL and Redis of the machine (127.0.0.1); set DATABASE_URL /
REDIS_URL to use others. Each pytest process gets its own test database (and, by default,
its own Redis database number), so concurrent runs on one machine don't wipe each other.
"""

import os

os.environ.setdefault("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/lockstep")
os.environ.setdefault("REDIS_URL", f"redis://127.0.0.1:6379/{1 + os.getpid() % 15}")
os.environ.setdefault("LOCKSTEP_TEST_DB", f"test_lockstep_{os.getpid()}")
os.environ.setdefault("LOCKSTEP_SETTLE_TIMEOUT", "3")
os.environ.setdefault("SECRET_KEY", "lockstep-test-suite-only")  # not the data folder's generated key

# pytest-xdist's workers (gw0, gw1, ...) inherit the environment of the run's first process: each
# takes a test database and a Redis database of its own next to that process's.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and not os.environ.get("LOCKSTEP_TEST_DB", "").endswith(_worker):
    _n = int(_worker[2:]) + 1
    os.environ["LOCKSTEP_TEST_DB"] += f"_{_worker}"
    _base, _, _db = os.environ["REDIS_URL"].rpartition("/")
    if _db.isdigit():
        os.environ["REDIS_URL"] = f"{_base}/{1 + (int(_db) - 1 + _n) % 15}"
