#!/usr/bin/env python
"""Django's command-line utility for Lockstep."""

import os
import sys
from pathlib import Path


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    if sys.argv[1:2] == ["up"] and not (os.environ.get("DATABASE_URL") or os.environ.get("REDIS_URL")):
        serve_embedded()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


def serve_embedded() -> None:
    """`up` alone starts the embedded PostgreSQL and Redis, before Django reads its settings, which
    only read where they listen (importing settings starts nothing)."""
    from dashboard.devstack import embedded

    base_dir = Path(__file__).resolve().parent
    data_dir = Path(os.environ.get("LOCKSTEP_DATA_DIR") or embedded.default_data_dir(base_dir))
    embedded.serve(data_dir, int(os.environ.get("LOCKSTEP_REDIS_PORT") or 0) or None)


if __name__ == "__main__":
    main()
