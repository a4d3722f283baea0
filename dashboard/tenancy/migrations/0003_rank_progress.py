"""`Rank.progress`: each rank's latest progress sample, kept by the statement that updates its row
(`sql.ranks_seen_cte`), so the sweep reads one row per rank instead of the newest of a dozen logged
samples. Both columns are nullable: adding them rewrites nothing, and a rank's first sample fills them."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenancy", "0002_rank_facts"),
    ]

    operations = [
        migrations.AddField(
            model_name="rank",
            name="progress",
            field=models.JSONField(null=True),
        ),
        migrations.AddField(
            model_name="rank",
            name="progress_at",
            field=models.DateTimeField(null=True),
        ),
    ]
