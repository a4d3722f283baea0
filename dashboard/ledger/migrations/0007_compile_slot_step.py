"""A compile slot keeps the step of its first report, so that it is complete once every rank's
progress has passed that step (dashboard.ledger.slots). Nullable: a column without a default, so
adding it rewrites no row."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0006_tables_named_for_their_app"),
    ]

    operations = [
        migrations.AddField(
            model_name="compileslot",
            name="step",
            field=models.BigIntegerField(null=True),
        ),
    ]
