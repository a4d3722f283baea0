"""Destinations and notifications are named for delivery, their owner: `table=None`, the default name,
`<app label>_<model>`. A rename only; no row moves. After every earlier migration of every app, so
that going back to any earlier state renames the tables back first (an earlier migration's SQL names
the tables as they were then)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("delivery", "0004_incident_pages"),
        ("detection", "0005_tables_named_for_their_app"),
    ]

    operations = [
        migrations.AlterModelTable(
            name="notification",
            table=None,
        ),
        migrations.AlterModelTable(
            name="webhook",
            table=None,
        ),
    ]
