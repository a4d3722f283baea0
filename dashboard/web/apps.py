from pathlib import Path

from django.apps import AppConfig
from django.conf import settings


class WebConfig(AppConfig):
    name = "dashboard.web"
    label = "web"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """WhiteNoise warns at every start of a STATIC_ROOT that does not exist (collectstatic fills it)."""
        Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)
