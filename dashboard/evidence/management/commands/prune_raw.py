"""`manage.py prune_raw [--days N]`: drop raw partitions past retention (also a Celery beat task)."""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from dashboard.evidence import retention


class Command(BaseCommand):
    help = "Drop raw per-rank partitions older than LOCKSTEP_RAW_RETENTION_DAYS (or --days) and expired batch records."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--days", type=float, default=None, help="override LOCKSTEP_RAW_RETENTION_DAYS")

    def handle(self, *args: object, days: float | None, **options: Any) -> None:
        pruned = retention.prune(days)
        for name in pruned.partitions:
            self.stdout.write(f"dropped {name}")
        self.stdout.write(
            f"{len(pruned.partitions)} partitions dropped, {pruned.sessions} idle agent sessions expired, "
            f"{pruned.waits} collective waits expired, {pruned.blobs} graph texts pruned"
        )
