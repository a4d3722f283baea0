"""A slot whose settle raised is quarantined (`quarantined_at`): settled without a verdict, so the
sweep stops retrying it, and counted in /metrics through a partial index (few rows). Nullable: a
column without a default, so adding it rewrites no row."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0007_compile_slot_step"),
    ]

    operations = [
        migrations.AddField(model_name="compileslot", name="quarantined_at", field=models.DateTimeField(null=True)),
        migrations.AddField(model_name="gradslot", name="quarantined_at", field=models.DateTimeField(null=True)),
        migrations.AddIndex(
            model_name="compileslot",
            index=models.Index(
                condition=models.Q(("quarantined_at__isnull", False)), fields=["run"], name="compile_slot_quarantined"
            ),
        ),
        migrations.AddIndex(
            model_name="gradslot",
            index=models.Index(
                condition=models.Q(("quarantined_at__isnull", False)), fields=["run"], name="grad_slot_quarantined"
            ),
        ),
    ]
