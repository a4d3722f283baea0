"""Only incidents page: notifications become (incident, webhook, revision), with the time Alertmanager's
copy of a firing incident is sent again; the Alertmanager silences that mirror acks and silences.

Notifications of alerts are dropped (forward and back): they cannot name an incident, and the
incidents' own outbox pages whatever is still firing."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


def drop_notifications(apps, schema_editor) -> None:
    apps.get_model("delivery", "Notification").objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [
        ("delivery", "0003_sinks"),
        ("detection", "0003_incidents"),
    ]

    operations = [
        migrations.RunPython(drop_notifications, drop_notifications),
        migrations.RemoveConstraint(model_name="notification", name="notify_once"),
        migrations.RemoveField(model_name="notification", name="alert"),
        migrations.AddField(
            model_name="notification",
            name="incident",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE, related_name="notifications", to="detection.incident"
            ),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="notification",
            name="refresh_at",
            field=models.DateTimeField(null=True),
        ),
        migrations.AddConstraint(
            model_name="notification",
            constraint=models.UniqueConstraint(fields=("incident", "webhook", "revision"), name="notify_once"),
        ),
        migrations.AddIndex(
            model_name="notification",
            index=models.Index(
                condition=models.Q(("refresh_at__isnull", False)), fields=["refresh_at"], name="notification_refresh"
            ),
        ),
        migrations.CreateModel(
            name="SinkSilence",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("until", models.DateTimeField(null=True)),
                ("comment", models.TextField(blank=True)),
                ("silence_id", models.CharField(blank=True, max_length=64)),
                ("state", models.CharField(default="pending", max_length=16)),
                ("attempts", models.PositiveIntegerField(default=0)),
                ("last_error", models.TextField(blank=True)),
                ("next_attempt_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "incident",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="detection.incident"
                    ),
                ),
                ("webhook", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="delivery.webhook")),
            ],
            options={
                "db_table": "delivery_sinksilence",
                "indexes": [
                    models.Index(
                        condition=models.Q(("state", "pending")), fields=["next_attempt_at"], name="sink_silence_due"
                    )
                ],
                "constraints": [models.UniqueConstraint(fields=("incident", "webhook"), name="sink_silence_once")],
            },
        ),
    ]
