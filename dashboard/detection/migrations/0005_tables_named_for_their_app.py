"""Alerts, silences and baselines are named for detection, their owner: `table=None`, the default name,
`<app label>_<model>`. A rename only; no row moves. After every earlier migration of every app, so
that going back to any earlier state renames the tables back first (an earlier migration's SQL names
the tables as they were then)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("detection", "0004_run_cost"),
        ("ledger", "0006_tables_named_for_their_app"),
    ]

    operations = [
        migrations.AlterModelTable(
            name="alert",
            table=None,
        ),
        migrations.AlterModelTable(
            name="baseline",
            table=None,
        ),
        migrations.AlterModelTable(
            name="silence",
            table=None,
        ),
    ]
