"""Slots, watermarks and detail requests, formerly models of `dashboard` and `ingest`. The tables stay where they are (`db_table`): this only hands Django's model state over."""

import django.contrib.postgres.fields
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("tenancy", "0001_initial"),
    ]

    state_operations = [
        migrations.CreateModel(
            name="CompileSlot",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("reported", models.PositiveIntegerField(default=0)),
                ("first_seen", models.DateTimeField()),
                ("settled_at", models.DateTimeField(null=True)),
                ("settled_n", models.PositiveIntegerField(default=0)),
                (
                    "dissenters",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.PositiveIntegerField(), default=list, size=None
                    ),
                ),
                ("consensus", models.JSONField(default=dict)),
                ("frame", models.CharField(max_length=512)),
                ("index", models.PositiveIntegerField()),
                ("run", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="tenancy.run")),
            ],
            options={
                "db_table": "dashboard_compileslot",
                "indexes": [models.Index(fields=["settled_at", "first_seen"], name="compile_slot_sweep")],
                "constraints": [models.UniqueConstraint(fields=("run", "frame", "index"), name="compile_slot_once")],
            },
        ),
        migrations.CreateModel(
            name="DetailRequest",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("rank", models.PositiveIntegerField()),
                ("step", models.BigIntegerField()),
                ("group", models.CharField(max_length=64)),
                ("alert_id", models.BigIntegerField(db_index=True)),
                ("asked_at", models.DateTimeField(null=True)),
                ("answered_at", models.DateTimeField(null=True)),
                ("run", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="tenancy.run")),
            ],
            options={
                "db_table": "dashboard_detailrequest",
                "indexes": [
                    models.Index(
                        condition=models.Q(("asked_at__isnull", True)), fields=["run", "rank"], name="detail_unasked"
                    )
                ],
                "constraints": [models.UniqueConstraint(fields=("run", "rank", "step", "group"), name="detail_once")],
            },
        ),
        migrations.CreateModel(
            name="GradSlot",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("reported", models.PositiveIntegerField(default=0)),
                ("first_seen", models.DateTimeField()),
                ("settled_at", models.DateTimeField(null=True)),
                ("settled_n", models.PositiveIntegerField(default=0)),
                (
                    "dissenters",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.PositiveIntegerField(), default=list, size=None
                    ),
                ),
                ("consensus", models.JSONField(default=dict)),
                ("step", models.BigIntegerField()),
                ("group", models.CharField(max_length=64)),
                ("run", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="tenancy.run")),
            ],
            options={
                "db_table": "dashboard_gradslot",
                "indexes": [
                    models.Index(fields=["settled_at", "first_seen"], name="grad_slot_sweep"),
                    models.Index(
                        condition=models.Q(("settled_at__isnull", False)),
                        fields=["run", "group", "step"],
                        name="grad_slot_settled",
                    ),
                ],
                "constraints": [models.UniqueConstraint(fields=("run", "step", "group"), name="grad_slot_once")],
            },
        ),
        migrations.CreateModel(
            name="GradWatermark",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("group", models.CharField(max_length=64)),
                ("rank", models.PositiveIntegerField()),
                ("step", models.BigIntegerField()),
                ("run", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="tenancy.run")),
            ],
            options={
                "db_table": "ingest_gradwatermark",
                "indexes": [models.Index(fields=["run", "group", "step"], name="watermark_min_max")],
                "constraints": [models.UniqueConstraint(fields=("run", "group", "rank"), name="watermark_per_rank")],
            },
        ),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=state_operations),
    ]
