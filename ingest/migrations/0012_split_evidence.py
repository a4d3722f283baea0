"""The batches, raw per-rank tables, graph texts and Flight Recorder dumps now belong to `evidence`:
this only hands Django's model state (and the content types) over; no row moves.
"""

from django.db import migrations

from dashboard.migrations._relabel import move_content_types

MOVED = {
    model: "evidence"
    for model in (
        "blob",
        "compileevent",
        "eventlog",
        "flightrecord",
        "gradreport",
        "graphbreakevent",
        "ingestbatch",
        "stepreport",
    )
}


class Migration(migrations.Migration):
    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("evidence", "0001_initial"),
        ("ingest", "0011_blob_quota"),
    ]

    state_operations = [
        migrations.RemoveField(
            model_name="compileevent",
            name="run",
        ),
        migrations.RemoveField(
            model_name="eventlog",
            name="run",
        ),
        migrations.RemoveField(
            model_name="flightrecord",
            name="run",
        ),
        migrations.RemoveField(
            model_name="gradreport",
            name="run",
        ),
        migrations.RemoveField(
            model_name="graphbreakevent",
            name="run",
        ),
        migrations.RemoveField(
            model_name="ingestbatch",
            name="run",
        ),
        migrations.RemoveField(
            model_name="stepreport",
            name="run",
        ),
        migrations.DeleteModel(
            name="Blob",
        ),
        migrations.DeleteModel(
            name="CompileEvent",
        ),
        migrations.DeleteModel(
            name="EventLog",
        ),
        migrations.DeleteModel(
            name="FlightRecord",
        ),
        migrations.DeleteModel(
            name="GradReport",
        ),
        migrations.DeleteModel(
            name="GraphBreakEvent",
        ),
        migrations.DeleteModel(
            name="IngestBatch",
        ),
        migrations.DeleteModel(
            name="StepReport",
        ),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=state_operations),
        move_content_types("ingest", MOVED),
    ]
