"""The batch table's age and run indexes as BRIN: one insert per batch no longer updates two B-trees."""

import django.contrib.postgres.indexes
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ingest", "0007_blob_named_at"),
        ("tenancy", "0003_rank_updates_hot"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="ingestbatch",
            name="batch_received",
        ),
        migrations.AlterField(
            model_name="ingestbatch",
            name="run",
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, to="tenancy.run"),
        ),
        migrations.AddIndex(
            model_name="ingestbatch",
            index=django.contrib.postgres.indexes.BrinIndex(
                autosummarize=True, fields=["received_at"], name="batch_received"
            ),
        ),
        migrations.AddIndex(
            model_name="ingestbatch",
            index=django.contrib.postgres.indexes.BrinIndex(autosummarize=True, fields=["run"], name="batch_run"),
        ),
    ]
