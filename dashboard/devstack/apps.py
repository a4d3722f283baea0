from django.apps import AppConfig


class DevstackConfig(AppConfig):
    """Holds no models; installed so that Django finds the `up` management command."""

    name = "dashboard.devstack"
    label = "devstack"
