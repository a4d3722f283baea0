"""Every batch updates its rank's row (last step, last seen): with room left in each page those
updates are HOT (no index entry written), and the run's own index is gone, rank_per_run leads with it."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenancy", "0002_run_key_per_project"),
    ]

    operations = [
        migrations.AlterField(
            model_name="rank",
            name="run",
            field=models.ForeignKey(
                db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name="ranks", to="tenancy.run"
            ),
        ),
        migrations.RunSQL(
            "ALTER TABLE ingest_rank SET (fillfactor = 50)", "ALTER TABLE ingest_rank RESET (fillfactor)"
        ),
    ]
