"""Run keys become unique per project (issue 17, item 1): a key another project took first no longer
blocks a job. Existing rows already satisfy the new constraint (keys were globally unique); going
back fails loudly if two projects now share a key, instead of dropping either run."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenancy", "0001_initial"),
    ]

    operations = [
        migrations.AlterField(
            model_name="run",
            name="key",
            field=models.CharField(max_length=200),
        ),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.UniqueConstraint(fields=("project", "key"), name="run_key_per_project"),
        ),
    ]
