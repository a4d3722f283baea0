from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """The project itself: the migration history of the tables from before the apps were split, and
    the database session label every process gets."""

    name = "dashboard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        connection_created.connect(_label_connection)


def _label_connection(sender, connection, **kwargs) -> None:
    """Name every PostgreSQL session after its OS process, so pg_stat_activity shows who holds what.

    With a connection pool (LOCKSTEP_DB_POOL) Django "connects" on every checkout of a pooled
    session; it is labelled once, not at every request (a round trip each)."""
    import os
    import sys

    role = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    label = f"lockstep:{role}:{os.getpid()}"
    raw = connection.connection
    if getattr(raw, "lockstep_label", None) == label:
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('application_name', %s, false)", [label])
    raw.lockstep_label = label
