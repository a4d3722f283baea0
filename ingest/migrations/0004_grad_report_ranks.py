"""A grad row names the ranks that reported it alike (`ranks integer[]`) instead of one `rank`.

Agreeing ranks sent in one request (a node relay's) then share a row: one per step instead of
one per rank-step. Existing rows keep their rank as a one-element array. Not reversible: a
shared row cannot be told apart again without splitting it.
"""
import django.contrib.postgres.fields
from django.db import migrations, models

SQL = """
ALTER TABLE ingest_gradreport DROP CONSTRAINT IF EXISTS ingest_gradreport_rank_check;
ALTER TABLE ingest_gradreport ALTER COLUMN rank TYPE integer[] USING ARRAY[rank];
ALTER TABLE ingest_gradreport RENAME COLUMN rank TO ranks;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('ingest', '0003_grad_watermark'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(SQL)],
            state_operations=[
                migrations.RemoveField(model_name='gradreport', name='rank'),
                migrations.AddField(
                    model_name='gradreport',
                    name='ranks',
                    field=django.contrib.postgres.fields.ArrayField(base_field=models.IntegerField(), size=None),
                    preserve_default=False,
                ),
            ],
        ),
    ]
