"""Lockstep's Django project: settings, URLs, the ASGI and Celery apps, detection, delivery and pages."""

from .celery import app as celery_app

__all__ = ["celery_app"]
