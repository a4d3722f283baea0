"""The evidence app's schema. Django creates plain tables; the SQL at the end makes the raw per-rank
tables PostgreSQL tables partitioned by day of `received`.

Retention drops whole partitions (`dashboard.evidence.retention`). Partitioned tables need the
partition key in the primary key, hence PRIMARY KEY (id, received); the run foreign key is not
enforced (db_constraint=False) because its per-row check cost as much as the insert itself on the
COPY path. `lockstep_raw_partition()` creates one table's partition for one UTC day and is safe to
race between ingest processes (`dashboard.evidence.partitions`).
"""

import django.contrib.postgres.fields
import django.contrib.postgres.indexes
import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

RAW_TABLES = (
    "evidence_compileevent",
    "evidence_graphbreakevent",
    "evidence_gradreport",
    "evidence_stepreport",
    "evidence_eventlog",
)

PARTITION_FUNCTION = """
CREATE OR REPLACE FUNCTION lockstep_raw_partition(parent text, day date) RETURNS text
LANGUAGE plpgsql AS $fn$
DECLARE
  part text := parent || '_p' || to_char(day, 'YYYYMMDD');
BEGIN
  IF to_regclass(part) IS NULL THEN
    BEGIN
      EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                     part, parent, day::text || ' 00:00:00+00', (day + 1)::text || ' 00:00:00+00');
    EXCEPTION WHEN duplicate_table OR unique_violation THEN
      NULL;  -- another process created it first
    END;
  END IF;
  RETURN part;
END
$fn$;
"""

# Each empty plain table Django made becomes a partitioned table of the same columns and indexes,
# with a week of partitions ready (afterwards the hourly prune task keeps a week ready).
PARTITION_TABLES = """
DO $do$
DECLARE
  t text;
  plain text;
  idx record;
BEGIN
  FOREACH t IN ARRAY ARRAY%s LOOP
    plain := t || '_plain';
    EXECUTE format('ALTER TABLE %%I RENAME TO %%I', t, plain);
    EXECUTE format('ALTER INDEX %%I RENAME TO %%I', t || '_pkey', plain || '_pkey');
    EXECUTE format('ALTER SEQUENCE %%I RENAME TO %%I', t || '_id_seq', plain || '_id_seq');
    EXECUTE format('CREATE TABLE %%I (LIKE %%I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY,'
                   ' PRIMARY KEY (id, received)) PARTITION BY RANGE (received)', t, plain);
    EXECUTE format('ALTER TABLE %%I ALTER COLUMN received SET DEFAULT now()', t);
    FOR idx IN SELECT indexname, indexdef FROM pg_indexes WHERE tablename = plain AND indexname <> plain || '_pkey' LOOP
      EXECUTE format('DROP INDEX %%I', idx.indexname);
      EXECUTE regexp_replace(idx.indexdef, ' ON \\S+ USING', ' ON ' || quote_ident(t) || ' USING');
    END LOOP;
    EXECUTE format('DROP TABLE %%I', plain);
    PERFORM lockstep_raw_partition(t, d::date)
      FROM generate_series((now() AT TIME ZONE 'UTC')::date - 1, (now() AT TIME ZONE 'UTC')::date + 7, interval '1 day') d;
  END LOOP;
END
$do$;
""" % ("['" + "','".join(RAW_TABLES) + "']")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("tenancy", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="Blob",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("hash", models.CharField(max_length=32)),
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
                "indexes": [
                    models.Index(fields=["project", "stored_at"], name="blob_project"),
                    models.Index(fields=["run"], name="blob_run"),
                ],
                "constraints": [models.UniqueConstraint(fields=("project", "hash"), name="blob_per_project")],
            },
        ),
        migrations.CreateModel(
            name="CollectiveWait",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("rank", models.PositiveIntegerField()),
                ("step", models.BigIntegerField()),
                ("seconds", models.FloatField()),
                ("received", models.DateTimeField(default=django.utils.timezone.now)),
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
                "indexes": [models.Index(fields=["received"], name="collectivewait_received")],
                "constraints": [models.UniqueConstraint(fields=("run", "step", "rank"), name="collectivewait_once")],
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
                "indexes": [models.Index(fields=["run", "frame", "index"], name="compileevent_run_frame")],
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
                ("size", models.PositiveIntegerField(default=0)),
                ("dump", models.JSONField()),
                ("run", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="tenancy.run")),
            ],
            options={
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
                "indexes": [models.Index(fields=["run", "step", "group"], name="gradreport_run_step")],
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
                "indexes": [models.Index(fields=["run", "rank", "step"], name="stepreport_run_rank")],
            },
        ),
        migrations.RunSQL(PARTITION_FUNCTION, "DROP FUNCTION lockstep_raw_partition(text, date)"),
        migrations.RunSQL(PARTITION_TABLES, migrations.RunSQL.noop),
    ]
