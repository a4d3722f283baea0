#!/usr/bin/env python
"""Django's command-line utility for Lockstep."""
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    if sys.argv[1:2] == ["up"]:  # README command 1: the development stack asks for development mode
        os.environ.setdefault("LOCKSTEP_DEV", "1")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
