"""Batch claims: one row per (run, agent session) with its accepted seqs (`IngestSession`) instead of
one row per batch (`IngestBatch`). The claims already made are carried over, so a batch accepted
before the upgrade is still a duplicate when its agent resends it after."""

import django.contrib.postgres.fields
import django.db.models.deletion
from django.db import migrations, models

import dashboard.evidence.models

CARRY_OVER = """
INSERT INTO evidence_ingestsession
    (run_id, session, rank, seqs, high, recent, batches, events, first_at, last_at)
SELECT g.run_id, g.session, g.rank, g.seqs, g.high,
       ARRAY(SELECT (SELECT ('x' || substr(b.digest, 1, 16))::bit(64)::bigint FROM evidence_ingestbatch b
                     WHERE b.run_id = g.run_id AND b.session = g.session AND b.seq > g.high - 16 AND b.seq % 16 = i)
             FROM generate_series(0, 15) i ORDER BY i),
       g.batches, g.events, g.first_at, g.last_at
FROM (
    SELECT run_id, session, min(rank) AS rank, range_agg(int8range(seq, seq, '[]')) AS seqs, max(seq) AS high,
           count(*) AS batches, sum(events) AS events, min(received_at) AS first_at, max(received_at) AS last_at
    FROM evidence_ingestbatch GROUP BY run_id, session
) g
"""


class Migration(migrations.Migration):
    dependencies = [
        ("evidence", "0001_initial"),
        ("tenancy", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="IngestSession",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("session", models.CharField(max_length=64)),
                ("rank", models.PositiveIntegerField()),
                ("seqs", dashboard.evidence.models.Int8MultiRangeField()),
                ("high", models.BigIntegerField()),
                (
                    "recent",
                    django.contrib.postgres.fields.ArrayField(base_field=models.BigIntegerField(null=True), size=16),
                ),
                ("batches", models.PositiveIntegerField()),
                ("events", models.BigIntegerField()),
                ("first_at", models.DateTimeField()),
                ("last_at", models.DateTimeField()),
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
                "constraints": [models.UniqueConstraint(fields=("run", "session"), name="session_once_per_run")],
            },
        ),
        migrations.RunSQL(
            "ALTER TABLE evidence_ingestsession SET (fillfactor = 50)",
            "ALTER TABLE evidence_ingestsession RESET (fillfactor)",
        ),
        migrations.RunSQL(CARRY_OVER, migrations.RunSQL.noop),
        migrations.DeleteModel(name="IngestBatch"),
    ]
