"""Every batch rewrites its rank's watermark row: without an index on its step, and with room left
in each page, that update is HOT (no index entry written). The highest and lowest steps are read
elsewhere or by a scan that stops early (dashboard.ledger.slots)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0004_fk_index_covered"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="gradwatermark", name="watermark_min_max"),
        migrations.RunSQL(
            "ALTER TABLE ingest_gradwatermark SET (fillfactor = 50)",
            "ALTER TABLE ingest_gradwatermark RESET (fillfactor)",
        ),
    ]
