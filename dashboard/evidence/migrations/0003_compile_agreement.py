"""Compile events stored as agreement: the per-rank table becomes `evidence_compileagreement`, a row
per compile that ranks reported alike with their ranks and each one's seconds and end, and
`evidence_compileevent` becomes a view of it a rank at a time. The rows already there are carried
over as rows of one rank each; the day partitions are renamed with their table (the partition
function finds them by name)."""

import django.contrib.postgres.fields
import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


def rename_partitions(old: str, new: str) -> str:
    """SQL: rename the day partitions of the table now named `evidence_compileagreement` from `old`'s
    names to `new`'s (the partition function finds a day's partition by its name)."""
    return f"""DO $do$
DECLARE
  part text;
BEGIN
  FOR part IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
              WHERE i.inhparent = 'evidence_compileagreement'::regclass LOOP
    EXECUTE format('ALTER TABLE %I RENAME TO %I', part, replace(part, '{old}', '{new}'));
  END LOOP;
END
$do$;"""


TO_AGREEMENT = f"""
ALTER TABLE evidence_compileevent RENAME TO evidence_compileagreement;
{rename_partitions("evidence_compileevent", "evidence_compileagreement")}
ALTER TABLE evidence_compileagreement
  ADD COLUMN ranks integer[], ADD COLUMN times double precision[], ADD COLUMN ends timestamptz[];
UPDATE evidence_compileagreement SET ranks = ARRAY[rank], times = ARRAY[compile_time], ends = ARRAY[ts];
ALTER TABLE evidence_compileagreement
  ALTER COLUMN ranks SET NOT NULL, ALTER COLUMN times SET NOT NULL, ALTER COLUMN ends SET NOT NULL,
  DROP COLUMN rank, DROP COLUMN compile_time, DROP COLUMN ts;
CREATE VIEW evidence_compileevent AS
  SELECT c.id, c.run_id, c.received, u.rank, c.frame, c.index, c.compile_id, c.step, c.status, c.fail_type,
         c.fail_reason, c.recompile_reason, c.graph_raw, c.graph_norm, c.code_raw, c.code_norm,
         u.compile_time, c.cache, c.detail, u.ts
  FROM evidence_compileagreement c CROSS JOIN LATERAL unnest(c.ranks, c.times, c.ends) AS u(rank, compile_time, ts);
"""

COLUMNS = (
    "run_id, received, frame, index, compile_id, step, status, fail_type, fail_reason, recompile_reason,"
    " graph_raw, graph_norm, code_raw, code_norm, cache, detail"
)
TO_PER_RANK = f"""
DROP VIEW evidence_compileevent;
ALTER TABLE evidence_compileagreement
  ADD COLUMN rank integer, ADD COLUMN compile_time double precision, ADD COLUMN ts timestamptz;
INSERT INTO evidence_compileagreement ({COLUMNS}, ranks, times, ends, rank, compile_time, ts)
  SELECT {", ".join("c." + c.strip() for c in COLUMNS.split(","))}, '{{}}', '{{}}', '{{}}', u.rank, u.compile_time, u.ts
  FROM evidence_compileagreement c CROSS JOIN LATERAL unnest(c.ranks, c.times, c.ends) AS u(rank, compile_time, ts);
DELETE FROM evidence_compileagreement WHERE rank IS NULL;
ALTER TABLE evidence_compileagreement
  ALTER COLUMN rank SET NOT NULL, ALTER COLUMN ts SET NOT NULL, ADD CHECK (rank >= 0),
  DROP COLUMN ranks, DROP COLUMN times, DROP COLUMN ends;
{rename_partitions("evidence_compileagreement", "evidence_compileevent")}
ALTER TABLE evidence_compileagreement RENAME TO evidence_compileevent;
"""

ALIKE: list[tuple[str, models.Field]] = [  # type: ignore[type-arg]
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
]


class Migration(migrations.Migration):
    dependencies = [
        ("evidence", "0002_claims_per_session"),
        ("tenancy", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(TO_AGREEMENT, TO_PER_RANK)],
            state_operations=[
                migrations.DeleteModel(name="CompileEvent"),
                migrations.CreateModel(
                    name="CompileAgreement",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("received", models.DateTimeField(default=django.utils.timezone.now)),
                        (
                            "ranks",
                            django.contrib.postgres.fields.ArrayField(base_field=models.IntegerField(), size=None),
                        ),
                        *[(name, field.clone()) for name, field in ALIKE],
                        (
                            "times",
                            django.contrib.postgres.fields.ArrayField(
                                base_field=models.FloatField(null=True), size=None
                            ),
                        ),
                        (
                            "ends",
                            django.contrib.postgres.fields.ArrayField(base_field=models.DateTimeField(), size=None),
                        ),
                        ("cache", models.JSONField(default=dict)),
                        ("detail", models.JSONField(default=dict)),
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
                    name="CompileEvent",
                    fields=[
                        ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                        ("received", models.DateTimeField()),
                        ("rank", models.PositiveIntegerField()),
                        *[(name, field.clone()) for name, field in ALIKE],
                        ("compile_time", models.FloatField(null=True)),
                        ("cache", models.JSONField(default=dict)),
                        ("detail", models.JSONField(default=dict)),
                        ("ts", models.DateTimeField()),
                        (
                            "run",
                            models.ForeignKey(
                                db_constraint=False,
                                db_index=False,
                                on_delete=django.db.models.deletion.DO_NOTHING,
                                to="tenancy.run",
                            ),
                        ),
                    ],
                    options={"managed": False, "db_table": "evidence_compileevent"},
                ),
            ],
        ),
    ]
