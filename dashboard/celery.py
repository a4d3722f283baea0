"""The Celery app (`celery -A dashboard worker`): slot settling, rule evaluation, notifications.

Database connections (docs/operating.md, Database connections): a prefork child (the default pool)
holds one while a task runs, and Celery's Django fixup closes the child's psycopg pool after every
task, so a worker holds at most `--concurrency`; its main process and beat hold none. A thread pool
shares the process's pool of LOCKSTEP_DB_POOL connections."""

import os

from celery import Celery
from celery.signals import worker_init

from dashboard.beat_schedule import BeatKeeper

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

app = Celery("dashboard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["dashboard.detection"], related_name="tasks")
app.steps["worker"].add(BeatKeeper)  # a worker started with -B starts a new beat if its beat dies


@worker_init.connect
def _bounded(**kwargs: object) -> None:
    """A worker's sessions wait for a lock and run a statement only so long (dashboard/apps.py), so a
    held table lock fails a sweep quickly instead of stalling it; the next sweep redoes the work."""
    from dashboard.apps import bound_sessions

    bound_sessions()
