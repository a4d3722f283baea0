"""Runs' compile bills (detection.RunCost)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("detection", "0003_incidents"),
        ("tenancy", "0004_project_gpu_hour_price"),
    ]

    operations = [
        migrations.CreateModel(
            name="RunCost",
            fields=[
                (
                    "run",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="compile_cost",
                        serialize=False,
                        to="tenancy.run",
                    ),
                ),
                ("gpu_seconds", models.FloatField(default=0.0)),
                ("counted", models.JSONField(default=dict)),
                ("frames", models.JSONField(default=list)),
                ("bill", models.JSONField(default=dict)),
                ("compile_seconds", models.FloatField(default=0.0)),
                ("computed_at", models.DateTimeField()),
            ],
            options={"db_table": "detection_runcost"},
        ),
    ]
