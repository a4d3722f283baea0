"""Batches, raw per-rank events, graph texts and Flight Recorder dumps, formerly models of `ingest`.
The tables stay where they are (`db_table`): this only hands Django's model state over (0002 renames them).
"""

import django.contrib.postgres.fields
import django.contrib.postgres.indexes
import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("ingest", "0011_blob_quota"),
        ("tenancy", "0004_project_gpu_hour_price"),
    ]

    state_operations = [
        migrations.CreateModel(
            name="Blob",
            fields=[
                ("hash", models.CharField(max_length=32, primary_key=True, serialize=False)),
                ("text", models.TextField(null=True)),
                ("size", models.PositiveIntegerField(default=0)),
                ("requested_at", models.DateTimeField(null=True)),
                ("stored_at", models.DateTimeField(null=True)),
                ("named_at", models.DateTimeField(null=True)),
                (
                    "project",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="tenancy.project",
                    ),
                ),
                (
                    "run",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="tenancy.run",
                    ),
                ),
            ],
            options={
                "db_table": "ingest_blob",
                "indexes": [
                    models.Index(fields=["project", "stored_at"], name="blob_project"),
                    models.Index(fields=["run"], name="blob_run"),
                ],
            },
        ),
        migrations.CreateModel(
            name="CompileEvent",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("received", models.DateTimeField(default=django.utils.timezone.now)),
                ("rank", models.PositiveIntegerField()),
                ("frame", models.CharField(max_length=512)),
                ("index", models.PositiveIntegerField()),
                ("compile_id", models.CharField(blank=True, max_length=64)),
                ("step", models.BigIntegerField(null=True)),
                ("status", models.CharField(max_length=16)),
                ("fail_type", models.TextField(null=True)),
                ("fail_reason", models.TextField(null=True)),
                ("recompile_reason", models.TextField(null=True)),
                ("graph_raw", models.CharField(blank=True, max_length=64)),
                ("graph_norm", models.CharField(blank=True, max_length=64)),
                ("code_raw", models.CharField(blank=True, max_length=64)),
                ("code_norm", models.CharField(blank=True, max_length=64)),
                ("compile_time", models.FloatField(null=True)),
                ("cache", models.JSONField(default=dict)),
                ("detail", models.JSONField(default=dict)),
                ("ts", models.DateTimeField()),
                (
                    "run",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="tenancy.run",
                    ),
                ),
            ],
            options={
                "db_table": "ingest_compileevent",
                "indexes": [models.Index(fields=["run", "frame", "index"], name="ingest_comp_run_id_864131_idx")],
            },
        ),
        migrations.CreateModel(
            name="EventLog",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("received", models.DateTimeField(default=django.utils.timezone.now)),
                ("rank", models.PositiveIntegerField()),
                ("t", models.CharField(max_length=32)),
                ("body", models.JSONField()),
                ("ts", models.DateTimeField()),
                (
                    "run",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="tenancy.run",
                    ),
                ),
            ],
            options={
                "db_table": "ingest_eventlog",
                "indexes": [models.Index(fields=["run", "t"], name="eventlog_run_t")],
            },
        ),
        migrations.CreateModel(
            name="FlightRecord",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("rank", models.PositiveIntegerField()),
                ("session", models.CharField(max_length=64)),
                ("ts", models.FloatField()),
                ("received", models.DateTimeField(default=django.utils.timezone.now)),
                ("entries", models.PositiveIntegerField(default=0)),
                ("dump", models.JSONField()),
                ("run", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="tenancy.run")),
            ],
            options={
                "db_table": "ingest_flightrecord",
                "indexes": [models.Index(fields=["run", "rank", "-received"], name="flightrecord_latest")],
            },
        ),
        migrations.CreateModel(
            name="GradReport",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("received", models.DateTimeField(default=django.utils.timezone.now)),
                ("ranks", django.contrib.postgres.fields.ArrayField(base_field=models.IntegerField(), size=None)),
                ("step", models.BigIntegerField()),
                ("group", models.CharField(max_length=64)),
                ("fps", django.contrib.postgres.fields.ArrayField(base_field=models.BigIntegerField(), size=None)),
                ("norm", models.FloatField(null=True)),
                ("nonfinite", models.BigIntegerField(default=0)),
                ("ts", models.DateTimeField()),
                (
                    "run",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="tenancy.run",
                    ),
                ),
            ],
            options={
                "db_table": "ingest_gradreport",
                "indexes": [models.Index(fields=["run", "step", "group"], name="ingest_grad_run_id_9dcac6_idx")],
            },
        ),
        migrations.CreateModel(
            name="GraphBreakEvent",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("received", models.DateTimeField(default=django.utils.timezone.now)),
                ("rank", models.PositiveIntegerField()),
                ("frame", models.CharField(max_length=512)),
                ("reason", models.TextField()),
                ("step", models.BigIntegerField(null=True)),
                ("ts", models.DateTimeField()),
                (
                    "run",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="tenancy.run",
                    ),
                ),
            ],
            options={
                "db_table": "ingest_graphbreakevent",
                "indexes": [models.Index(fields=["run", "frame"], name="graphbreak_run_frame")],
            },
        ),
        migrations.CreateModel(
            name="IngestBatch",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("session", models.CharField(max_length=64)),
                ("seq", models.BigIntegerField()),
                ("digest", models.CharField(max_length=64)),
                ("rank", models.PositiveIntegerField()),
                ("events", models.PositiveIntegerField()),
                ("received_at", models.DateTimeField(auto_now_add=True)),
                (
                    "run",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="tenancy.run",
                    ),
                ),
            ],
            options={
                "db_table": "ingest_ingestbatch",
                "indexes": [
                    django.contrib.postgres.indexes.BrinIndex(
                        autosummarize=True, fields=["received_at"], name="batch_received"
                    ),
                    django.contrib.postgres.indexes.BrinIndex(autosummarize=True, fields=["run"], name="batch_run"),
                ],
                "constraints": [models.UniqueConstraint(fields=("session", "seq", "run"), name="batch_once_per_run")],
            },
        ),
        migrations.CreateModel(
            name="StepReport",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("received", models.DateTimeField(default=django.utils.timezone.now)),
                ("rank", models.PositiveIntegerField()),
                ("step", models.BigIntegerField()),
                ("loss", models.FloatField(null=True)),
                ("step_time", models.FloatField(null=True)),
                ("ts", models.DateTimeField()),
                (
                    "run",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="tenancy.run",
                    ),
                ),
            ],
            options={
                "db_table": "ingest_stepreport",
                "indexes": [models.Index(fields=["run", "rank", "step"], name="ingest_step_run_id_6f9648_idx")],
            },
        ),
    ]

    operations = [migrations.SeparateDatabaseAndState(state_operations=state_operations)]
