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
