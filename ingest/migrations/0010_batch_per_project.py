"""(session, seq) is unique per run, so per project (run keys are per project): a project that learns
another's session id can no longer have that project's batches refused (409) or dropped as duplicates.
The new constraint comes first, so no moment is without one."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ingest", "0009_batch_run_unconstrained"),
        ("tenancy", "0003_rank_updates_hot"),
    ]

    operations = [
        migrations.AddConstraint(
            model_name="ingestbatch",
            constraint=models.UniqueConstraint(fields=("session", "seq", "run"), name="batch_once_per_run"),
        ),
        migrations.RemoveConstraint(
            model_name="ingestbatch",
            name="batch_once",
        ),
    ]
