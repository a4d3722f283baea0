from django.apps import AppConfig


class DeliveryConfig(AppConfig):
    name = "dashboard.delivery"
    label = "delivery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_save

        from dashboard.delivery import tasks
        from dashboard.detection import signals
        from dashboard.detection.models import Silence

        signals.alerts_changed.connect(tasks.on_alerts_changed, dispatch_uid="delivery.deliver")
        post_save.connect(tasks.on_silence_saved, sender=Silence, dispatch_uid="delivery.mirror_silences")
