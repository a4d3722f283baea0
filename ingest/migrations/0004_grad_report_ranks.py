"""A grad row names the ranks that reported it alike (`ranks integer[]`) instead of one `rank`.

Agreeing ranks sent in one request (a node relay's) then share a row: one per step instead of
one per rank-step. Existing rows keep their rank as a one-element array; going back splits
shared rows into one per rank.
"""

import django.contrib.postgres.fields
from django.db import migrations, models

SQL = """
ALTER TABLE ingest_gradreport DROP CONSTRAINT IF EXISTS ingest_gradreport_rank_check;
ALTER TABLE ingest_gradreport ALTER COLUMN rank TYPE integer[] USING ARRAY[rank];
ALTER TABLE ingest_gradreport RENAME COLUMN rank TO ranks;
"""

REVERSE_SQL = """
INSERT INTO ingest_gradreport (run_id, ranks, "group", step, fps, norm, nonfinite, ts, received)
  SELECT run_id, ARRAY[r], "group", step, fps, norm, nonfinite, ts, received
  FROM ingest_gradreport, unnest(ranks[2:]) r WHERE cardinality(ranks) > 1;
ALTER TABLE ingest_gradreport RENAME COLUMN ranks TO rank;
ALTER TABLE ingest_gradreport ALTER COLUMN rank TYPE integer USING rank[1];
ALTER TABLE ingest_gradreport ADD CONSTRAINT ingest_gradreport_rank_check CHECK (rank >= 0);
"""


class Migration(migrations.Migration):
    dependencies = [
        ("ingest", "0003_grad_watermark"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(SQL, REVERSE_SQL)],
            state_operations=[
                migrations.RemoveField(model_name="gradreport", name="rank"),
                migrations.AddField(
                    model_name="gradreport",
                    name="ranks",
                    field=django.contrib.postgres.fields.ArrayField(base_field=models.IntegerField(), size=None),
                    preserve_default=False,
                ),
            ],
        ),
    ]
