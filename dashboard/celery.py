"""The Celery app (`celery -A dashboard worker`): slot settling, rule evaluation, notifications."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

app = Celery("dashboard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["dashboard.detection"], related_name="tasks")
