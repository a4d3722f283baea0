"""Project tokens get scopes. Tokens issued before keep ingest and read, and lose resolving and
choosing baselines: those now need a token created with that scope (`createtoken --scope`)."""

import django.contrib.postgres.fields
from django.db import migrations, models

import dashboard.tenancy.models


class Migration(migrations.Migration):
    dependencies = [
        ("tenancy", "0005_tables_named_for_their_app"),
    ]

    operations = [
        migrations.AddField(
            model_name="projecttoken",
            name="scopes",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(max_length=16),
                default=dashboard.tenancy.models.default_scopes,
                size=None,
            ),
        ),
    ]
