"""Projects, tokens, runs and ranks are named for tenancy, their owner (they kept ingest's names):
`table=None`, the default name, `<app label>_<model>`. A rename only; no row moves. After every
earlier migration of every app, so that going back to any earlier state renames the tables back
first (an earlier migration's SQL names the tables as they were then)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("tenancy", "0004_project_gpu_hour_price"),
        ("ingest", "0012_split_evidence"),
        ("evidence", "0002_tables_named_for_evidence"),
        ("dashboard", "0005_split_into_apps"),
        ("ledger", "0005_watermark_updates_hot"),
        ("detection", "0004_run_cost"),
        ("delivery", "0004_incident_pages"),
    ]

    operations = [
        migrations.AlterModelTable(
            name="project",
            table=None,
        ),
        migrations.AlterModelTable(
            name="projecttoken",
            table=None,
        ),
        migrations.AlterModelTable(
            name="rank",
            table=None,
        ),
        migrations.AlterModelTable(
            name="run",
            table=None,
        ),
    ]
