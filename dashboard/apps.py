from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper


class DashboardConfig(AppConfig):
    """The project itself: the migration history of the tables from before the apps were split, and
    the database session label every process gets."""

    name = "dashboard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        connection_created.connect(_label_connection)


BOUNDS: dict[str, str] = {}  # session settings of every connection of this process (`bound_sessions`)


def bound_sessions() -> None:
    """Bound every lock wait and statement of this process's sessions (LOCKSTEP_DB_LOCK_TIMEOUT,
    LOCKSTEP_DB_STATEMENT_TIMEOUT): called by the servers (dashboard/asgi.py) and the Celery workers
    (dashboard/celery.py), so a table lock held by someone else costs ingest a quick 503 + Retry-After
    and the sweep one failed run, never a queue of requests that waits as long as the lock. Migrations
    and management commands are not bounded."""
    from django.conf import settings

    BOUNDS.update(
        lock_timeout=f"{int(settings.LOCKSTEP_DB_LOCK_TIMEOUT * 1000)}ms",
        statement_timeout=f"{int(settings.LOCKSTEP_DB_STATEMENT_TIMEOUT * 1000)}ms",
    )


def _label_connection(sender: object, connection: BaseDatabaseWrapper, **kwargs: object) -> None:
    """Name every PostgreSQL session after its OS process, so pg_stat_activity shows who holds what,
    and give it the process's bounds (`bound_sessions`), in the same round trip.

    With a connection pool (LOCKSTEP_DB_POOL) Django "connects" on every checkout of a pooled
    session; it is labelled once, not at every request (a round trip each)."""
    import os
    import sys

    role = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    label = f"lockstep:{role}:{os.getpid()}"
    raw = connection.connection
    if getattr(raw, "lockstep_label", None) == (label, BOUNDS):
        return
    settings = {"application_name": label, **BOUNDS}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT " + ", ".join("set_config(%s, %s, false)" for _ in settings),
            [v for item in settings.items() for v in item],
        )
    raw.lockstep_label = (label, dict(BOUNDS))
