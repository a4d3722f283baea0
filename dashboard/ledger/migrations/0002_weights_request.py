"""Weights requests stored once for every rank (`WeightsRequest`) instead of a `DetailRequest` row per
rank of group "param:<group>". The requests not handed out yet are carried over, one row per (run,
step, group); the per-rank rows go. Undone, the table goes and requests still pending are dropped
(a divergence then waits for the ranks' next regular weight fingerprint)."""

import django.db.models.deletion
from django.db import migrations, models

TO_ONE_ROW = """
INSERT INTO ledger_weightsrequest (run_id, step, "group", alert_id, created_at)
  SELECT run_id, step, substr("group", length('param:') + 1), min(alert_id), now()
  FROM ledger_detailrequest WHERE starts_with("group", 'param:') AND answered_at IS NULL
  GROUP BY run_id, step, "group";
DELETE FROM ledger_detailrequest WHERE starts_with("group", 'param:');
"""


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0001_initial"),
        ("tenancy", "0003_rank_progress"),
    ]

    operations = [
        migrations.CreateModel(
            name="WeightsRequest",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("step", models.BigIntegerField()),
                ("group", models.CharField(max_length=64)),
                ("alert_id", models.BigIntegerField()),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("run", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="tenancy.run")),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("run", "step", "group"), name="weights_once")],
            },
        ),
        migrations.RunSQL(TO_ONE_ROW, migrations.RunSQL.noop),
    ]
