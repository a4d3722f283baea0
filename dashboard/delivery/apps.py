from django.apps import AppConfig


class DeliveryConfig(AppConfig):
    name = "dashboard.delivery"
    label = "delivery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from dashboard.delivery import tasks
        from dashboard.detection import signals

        signals.alerts_changed.connect(tasks.on_alerts_changed, dispatch_uid="delivery.deliver")
