"""The batch table's run without a database constraint: PostgreSQL checked it for every inserted
batch at commit (a deferred trigger and a key-share lock of the run row each). Deleting a run still
deletes its batches (Django's cascade)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ingest", "0008_batch_indexes_brin"),
        ("tenancy", "0003_rank_updates_hot"),
    ]

    operations = [
        migrations.AlterField(
            model_name="ingestbatch",
            name="run",
            field=models.ForeignKey(
                db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, to="tenancy.run"
            ),
        ),
    ]
