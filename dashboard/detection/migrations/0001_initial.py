"""Alerts, silences and baselines, formerly models of `dashboard`. The tables stay where they are (`db_table`): this only hands Django's model state over."""

import django.contrib.postgres.fields
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("tenancy", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    state_operations = [
        migrations.CreateModel(
            name="Baseline",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "baseline",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="baseline_for", to="tenancy.run"
                    ),
                ),
                (
                    "chosen_by",
                    models.ForeignKey(
                        null=True, on_delete=django.db.models.deletion.SET_NULL, to=settings.AUTH_USER_MODEL
                    ),
                ),
                (
                    "run",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE, related_name="baseline_link", to="tenancy.run"
                    ),
                ),
            ],
            options={
                "db_table": "dashboard_baseline",
            },
        ),
        migrations.CreateModel(
            name="Silence",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("kind", models.CharField(blank=True, max_length=64)),
                ("rank", models.PositiveIntegerField(blank=True, null=True)),
                ("expires_at", models.DateTimeField()),
                ("comment", models.TextField()),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "author",
                    models.ForeignKey(
                        null=True, on_delete=django.db.models.deletion.SET_NULL, to=settings.AUTH_USER_MODEL
                    ),
                ),
                (
                    "project",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="silences", to="tenancy.project"
                    ),
                ),
                (
                    "run",
                    models.ForeignKey(
                        blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, to="tenancy.run"
                    ),
                ),
            ],
            options={
                "db_table": "dashboard_silence",
                "ordering": ["-created_at"],
            },
        ),
        migrations.CreateModel(
            name="Alert",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("kind", models.CharField(max_length=64)),
                ("subject", models.CharField(max_length=600)),
                ("severity", models.CharField(max_length=16)),
                (
                    "state",
                    models.CharField(
                        choices=[("firing", "Firing"), ("resolved", "Resolved")], default="firing", max_length=16
                    ),
                ),
                (
                    "ranks",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.PositiveIntegerField(), default=list, size=None
                    ),
                ),
                ("step", models.BigIntegerField(null=True)),
                ("frame", models.CharField(max_length=512, null=True)),
                ("message", models.TextField()),
                ("details", models.JSONField(default=dict)),
                ("count", models.PositiveIntegerField(default=1)),
                ("first_seen", models.DateTimeField(auto_now_add=True)),
                ("last_seen", models.DateTimeField(auto_now=True)),
                ("acked_at", models.DateTimeField(null=True)),
                ("resolved_at", models.DateTimeField(null=True)),
                ("last_position", models.BigIntegerField(null=True)),
                ("revision", models.PositiveIntegerField(default=1)),
                ("notified_revision", models.PositiveIntegerField(default=0)),
                (
                    "acked_by",
                    models.ForeignKey(
                        blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, to=settings.AUTH_USER_MODEL
                    ),
                ),
                (
                    "run",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="alerts", to="tenancy.run"
                    ),
                ),
            ],
            options={
                "db_table": "dashboard_alert",
                "ordering": ["-first_seen"],
                "constraints": [models.UniqueConstraint(fields=("run", "kind", "subject"), name="alert_identity")],
            },
        ),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=state_operations),
    ]
