"""The Celery app (`celery -A dashboard worker`): slot settling, rule evaluation, notifications."""

import os

from celery import Celery
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

app = Celery("dashboard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["dashboard.detection"], related_name="tasks")


@worker_init.connect
def _bounded(**kwargs) -> None:
    """A worker's sessions wait for a lock and run a statement only so long (dashboard/apps.py), so a
    held table lock fails a sweep quickly instead of stalling it; the next sweep redoes the work."""
    from dashboard.apps import bound_sessions

    bound_sessions()
