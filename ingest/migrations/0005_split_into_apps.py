"""Projects, tokens, runs and ranks now belong to `tenancy`, watermarks to `ledger`; ingest keeps the raw
tables, whose run foreign keys now point at `tenancy.Run`. The tables stay where they are (`db_table`):
this only hands Django's model state over.
"""

import django.db.models.deletion
from django.db import migrations, models

from dashboard.migrations._relabel import move_content_types

MOVED = {
    "project": "tenancy",
    "projecttoken": "tenancy",
    "run": "tenancy",
    "rank": "tenancy",
    "gradwatermark": "ledger",
}


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0005_split_into_apps"),
        ("ledger", "0001_initial"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("ingest", "0004_grad_report_ranks"),
        ("tenancy", "0001_initial"),
    ]

    state_operations = [
        migrations.RemoveField(
            model_name="project",
            name="members",
        ),
        migrations.RemoveField(
            model_name="run",
            name="project",
        ),
        migrations.RemoveField(
            model_name="projecttoken",
            name="project",
        ),
        migrations.RemoveField(
            model_name="rank",
            name="run",
        ),
        migrations.AlterField(
            model_name="graphbreakevent",
            name="run",
            field=models.ForeignKey(
                db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, to="tenancy.run"
            ),
        ),
        migrations.AlterField(
            model_name="compileevent",
            name="run",
            field=models.ForeignKey(
                db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, to="tenancy.run"
            ),
        ),
        migrations.AlterField(
            model_name="eventlog",
            name="run",
            field=models.ForeignKey(
                db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, to="tenancy.run"
            ),
        ),
        migrations.AlterField(
            model_name="stepreport",
            name="run",
            field=models.ForeignKey(
                db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, to="tenancy.run"
            ),
        ),
        migrations.AlterField(
            model_name="ingestbatch",
            name="run",
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="tenancy.run"),
        ),
        migrations.AlterField(
            model_name="gradreport",
            name="run",
            field=models.ForeignKey(
                db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, to="tenancy.run"
            ),
        ),
        migrations.DeleteModel(
            name="GradWatermark",
        ),
        migrations.DeleteModel(
            name="Project",
        ),
        migrations.DeleteModel(
            name="ProjectToken",
        ),
        migrations.DeleteModel(
            name="Rank",
        ),
        migrations.DeleteModel(
            name="Run",
        ),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=state_operations),
        move_content_types("ingest", MOVED),
    ]
