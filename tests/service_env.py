"""Loaded with `-p` before pytest-django reads settings: point the suite at real servers.

Defaults are the PostgreSQL and Redis of the machine (127.0.0.1); set DATABASE_URL /
REDIS_URL to use others. pytest-django creates a separate `test_*` database.
"""
import os

os.environ.setdefault("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/lockstep")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/9")
os.environ.setdefault("LOCKSTEP_SETTLE_TIMEOUT", "3")
