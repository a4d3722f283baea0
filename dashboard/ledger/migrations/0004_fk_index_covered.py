"""Each batch rewrites its rank's watermark rows, and every index of the table with them: the run's
own index is gone, both remaining indexes lead with the run."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0003_detail_asked_again"),
        ("tenancy", "0003_rank_updates_hot"),
    ]

    operations = [
        migrations.AlterField(
            model_name="gradwatermark",
            name="run",
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, to="tenancy.run"),
        ),
    ]
