"""`python manage.py sinks apply FILE [--prune] [--dry-run]` and `sinks export [--project NAME ...]`:
alert destinations as code (dashboard/delivery/sinks_file.py, docs/integrations.md)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dashboard.delivery import sinks_file


class Command(BaseCommand):
    help = "Apply alert destinations from a TOML file (idempotent), or print the current ones without secrets."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="apply|export")
        apply = actions.add_parser("apply", help="make the file's projects' destinations what the file says")
        apply.add_argument("file", help="TOML file of [[destination]] tables; ${NAME} is read from the environment")
        apply.add_argument(
            "--prune",
            action="store_true",
            help="remove destinations of the file's projects that the file does not list",
        )
        apply.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")
        export = actions.add_parser("export", help="print the destinations as a file `apply` takes, secrets not shown")
        export.add_argument("--project", action="append", help="only this project's (repeatable)")

    def handle(self, *args: object, action: str, **options: Any) -> None:
        if action == "export":
            self.stdout.write(sinks_file.export(options.get("project")), ending="")
            return
        try:
            with open(options["file"], encoding="utf-8") as f:
                entries = sinks_file.parse(f.read(), settings.SINKS_FILE_VARIABLES)
            changes = sinks_file.apply(entries, prune=options["prune"], dry_run=options["dry_run"])
        except OSError as exc:
            raise CommandError(f"cannot read {options['file']}: {exc.strerror}") from None
        except sinks_file.SinksFileError as exc:
            raise CommandError(f"{options['file']}: {exc} (nothing changed)") from None
        for change in changes:
            self.stdout.write(change.line())
        counts = Counter(c.action for c in changes)
        summary = ", ".join(
            f"{counts[a]} {a}"
            for a in (sinks_file.CREATED, sinks_file.UPDATED, sinks_file.UNCHANGED, sinks_file.REMOVED)
        )
        self.stdout.write(summary + (" (dry run: nothing stored)" if options["dry_run"] else ""))
