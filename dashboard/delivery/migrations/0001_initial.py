"""Webhooks and notifications, formerly models of `dashboard`. The tables stay where they are (`db_table`): this only hands Django's model state over."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("detection", "0001_initial"),
        ("tenancy", "0001_initial"),
    ]

    state_operations = [
        migrations.CreateModel(
            name="Webhook",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("url", models.URLField(max_length=1000)),
                ("active", models.BooleanField(default=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "project",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="webhooks", to="tenancy.project"
                    ),
                ),
            ],
            options={
                "db_table": "dashboard_webhook",
            },
        ),
        migrations.CreateModel(
            name="Notification",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("revision", models.PositiveIntegerField()),
                ("state", models.CharField(default="pending", max_length=16)),
                ("attempts", models.PositiveIntegerField(default=0)),
                ("sent_at", models.DateTimeField(null=True)),
                ("last_error", models.TextField(blank=True)),
                (
                    "alert",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="notifications", to="detection.alert"
                    ),
                ),
                ("webhook", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="delivery.webhook")),
            ],
            options={
                "db_table": "dashboard_notification",
                "constraints": [models.UniqueConstraint(fields=("alert", "webhook", "revision"), name="notify_once")],
            },
        ),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=state_operations),
    ]
