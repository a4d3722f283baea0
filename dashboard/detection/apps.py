from django.apps import AppConfig


class DetectionConfig(AppConfig):
    name = "dashboard.detection"
    label = "detection"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from dashboard.detection import metrics, rules, tasks
        from dashboard.ledger import signals
        from ingest.metrics import register

        rules.load_all()
        signals.slots_ready.connect(tasks.on_slots_ready, dispatch_uid="detection.settle")
        signals.details_received.connect(tasks.on_details_received, dispatch_uid="detection.explain")
        signals.flight_records_received.connect(tasks.on_flight_record, dispatch_uid="detection.flight_recorder")
        register(metrics.HealthCollector())  # /metrics: per-project and per-run health
