"""The waits in a collective the compile bill measures, kept as ingest writes them (`CollectiveWait`).

Until now the bill found them in the progress samples of the log through a partial index, parsing a
JSON body per sample (121k at 1,024 ranks x 10k steps, over 100 ms of a from-scratch bill). The
table keeps the longest wait per (run, rank, step) of the waits that lasted STUCK_S (5 s), the only
ones the bill counts; it is filled here from the samples already in the log, and the partial index
goes. Back: the index is built again and the table dropped (the samples stay in the log).
"""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

BACKFILL = """
    INSERT INTO evidence_collectivewait (run_id, rank, step, seconds, received)
    SELECT run_id, rank, (body ->> 'step')::bigint, max((body ->> 'phase_s')::float8), max(received)
    FROM evidence_eventlog
    WHERE t = 'progress' AND body ->> 'phase' = 'collective' AND jsonb_typeof(body -> 'step') = 'number'
      AND (body ->> 'phase_s')::float8 >= 5.0
    GROUP BY 1, 2, 3
"""


class Migration(migrations.Migration):
    dependencies = [
        ("evidence", "0003_collective_wait_index"),
        ("tenancy", "0005_tables_named_for_their_app"),
    ]

    operations = [
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
                "constraints": [models.UniqueConstraint(fields=("run", "step", "rank"), name="collectivewait_once")],
                "indexes": [models.Index(fields=["received"], name="collectivewait_received")],
            },
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
        migrations.RemoveIndex(model_name="eventlog", name="eventlog_collective_step"),
    ]
