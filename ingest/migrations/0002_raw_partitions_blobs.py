"""Raw per-rank tables become PostgreSQL tables partitioned by day of `received`; blobs.

Retention then drops whole partitions (ingest.retention). The existing rows move into daily
partitions of their agent timestamp; indexes keep their names so Django's state still matches.
Partitioned tables need the partition key in the primary key, hence PRIMARY KEY (id, received);
the per-row foreign key check to ingest_run is dropped (db_constraint=False) because it cost as
much as the insert itself on the COPY path.
"""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

RAW_TABLES = (
    "ingest_compileevent",
    "ingest_graphbreakevent",
    "ingest_gradreport",
    "ingest_stepreport",
    "ingest_eventlog",
)

# Creates (idempotently, race-safe between ingest processes) the partition of `parent` for one UTC day.
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

PARTITION_TABLES = """
DO $do$
DECLARE
  t text;
  legacy text;
  idx record;
BEGIN
  FOREACH t IN ARRAY ARRAY%s LOOP
    legacy := t || '_legacy';
    EXECUTE format('ALTER TABLE %%I RENAME TO %%I', t, legacy);
    EXECUTE format('ALTER INDEX %%I RENAME TO %%I', t || '_pkey', legacy || '_pkey');
    EXECUTE format('ALTER SEQUENCE %%I RENAME TO %%I', t || '_id_seq', legacy || '_id_seq');
    EXECUTE format('CREATE TABLE %%I (LIKE %%I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY,'
                   ' received timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (id, received))'
                   ' PARTITION BY RANGE (received)', t, legacy);
    EXECUTE format('SELECT lockstep_raw_partition(%%L, d) FROM (SELECT DISTINCT (ts AT TIME ZONE ''UTC'')::date AS d FROM %%I) days',
                   t, legacy);
    EXECUTE format('INSERT INTO %%I SELECT *, ts FROM %%I', t, legacy);
    EXECUTE format('SELECT setval(pg_get_serial_sequence(%%L, ''id''), COALESCE((SELECT max(id) FROM %%I), 0) + 1, false)',
                   t, t);
    FOR idx IN SELECT indexname, indexdef FROM pg_indexes WHERE tablename = legacy AND indexname <> legacy || '_pkey' LOOP
      EXECUTE format('DROP INDEX %%I', idx.indexname);
      CONTINUE WHEN idx.indexdef LIKE '%%(run_id)';  -- the FK's own index: composite indexes lead with run_id
      EXECUTE regexp_replace(idx.indexdef, ' ON \\S+ USING', ' ON ' || quote_ident(t) || ' USING');
    END LOOP;
    EXECUTE format('DROP TABLE %%I', legacy);
    -- ready ahead (afterwards the hourly prune task keeps a week ready)
    PERFORM lockstep_raw_partition(t, d::date)
      FROM generate_series((now() AT TIME ZONE 'UTC')::date - 1, (now() AT TIME ZONE 'UTC')::date + 7, interval '1 day') d;
  END LOOP;
END
$do$;
""" % ("['" + "','".join(RAW_TABLES) + "']")


class Migration(migrations.Migration):
    dependencies = [
        ("ingest", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="Blob",
            fields=[
                ("hash", models.CharField(max_length=32, primary_key=True, serialize=False)),
                ("text", models.TextField(null=True)),
                ("size", models.PositiveIntegerField(default=0)),
                ("requested_at", models.DateTimeField(null=True)),
                ("stored_at", models.DateTimeField(null=True)),
            ],
        ),
        migrations.RunSQL(PARTITION_FUNCTION, "DROP FUNCTION lockstep_raw_partition(text, date)"),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(PARTITION_TABLES)],
            state_operations=[
                migrations.AddField(
                    model_name="compileevent",
                    name="received",
                    field=models.DateTimeField(default=django.utils.timezone.now),
                ),
                migrations.AddField(
                    model_name="eventlog",
                    name="received",
                    field=models.DateTimeField(default=django.utils.timezone.now),
                ),
                migrations.AddField(
                    model_name="gradreport",
                    name="received",
                    field=models.DateTimeField(default=django.utils.timezone.now),
                ),
                migrations.AddField(
                    model_name="graphbreakevent",
                    name="received",
                    field=models.DateTimeField(default=django.utils.timezone.now),
                ),
                migrations.AddField(
                    model_name="stepreport",
                    name="received",
                    field=models.DateTimeField(default=django.utils.timezone.now),
                ),
                migrations.AlterField(
                    model_name="compileevent",
                    name="run",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="ingest.run",
                    ),
                ),
                migrations.AlterField(
                    model_name="eventlog",
                    name="run",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="ingest.run",
                    ),
                ),
                migrations.AlterField(
                    model_name="gradreport",
                    name="run",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="ingest.run",
                    ),
                ),
                migrations.AlterField(
                    model_name="graphbreakevent",
                    name="run",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="ingest.run",
                    ),
                ),
                migrations.AlterField(
                    model_name="stepreport",
                    name="run",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="ingest.run",
                    ),
                ),
            ],
        ),
        migrations.AddIndex(
            model_name="graphbreakevent",
            index=models.Index(fields=["run", "frame"], name="graphbreak_run_frame"),
        ),
        migrations.AddIndex(
            model_name="eventlog",
            index=models.Index(fields=["run", "t"], name="eventlog_run_t"),
        ),
        migrations.AddIndex(
            model_name="ingestbatch",
            index=models.Index(fields=["received_at"], name="batch_received"),
        ),
    ]
