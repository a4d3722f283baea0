"""Slots, watermarks and detail requests are named for the ledger, their owner: `table=None`, the
default name, `<app label>_<model>`. A rename only; no row moves. After every earlier migration of
every app, so that going back to any earlier state renames the tables back first (an earlier
migration's SQL names the tables as they were then)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0005_watermark_updates_hot"),
        ("tenancy", "0005_tables_named_for_their_app"),
    ]

    operations = [
        migrations.AlterModelTable(
            name="compileslot",
            table=None,
        ),
        migrations.AlterModelTable(
            name="detailrequest",
            table=None,
        ),
        migrations.AlterModelTable(
            name="gradslot",
            table=None,
        ),
        migrations.AlterModelTable(
            name="gradwatermark",
            table=None,
        ),
    ]
