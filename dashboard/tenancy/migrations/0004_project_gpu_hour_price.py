"""A project's price per GPU-hour (the compile bill in money) and its own compile budget."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenancy", "0003_rank_updates_hot"),
    ]

    operations = [
        migrations.AddField(
            model_name="project",
            name="gpu_hour_price",
            field=models.DecimalField(blank=True, decimal_places=4, max_digits=12, null=True),
        ),
        migrations.AddField(
            model_name="project",
            name="compile_budget",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="project",
            name="compile_budget_after",
            field=models.FloatField(blank=True, null=True),
        ),
    ]
