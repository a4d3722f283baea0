"""A partial index on the progress samples that report a wait in a collective, by run and step.

The compile bill (`dashboard.detection.cost.bill_of`, through `reads.collective_waits`) reads the
longest such wait per rank of the steps that compiled; with only (run, t) indexed, PostgreSQL read
every progress sample of the run (735k rows at 1,024 ranks x 10k steps, most of a second). The
index holds only the collective-phase samples (a sixth of them there). CREATE INDEX on the
partitioned parent builds it on every existing daily partition, and each partition made later
(`lockstep_raw_partition()`: CREATE TABLE ... PARTITION OF) gets its own; back: DROP INDEX drops
the partitions' indexes with it.
"""

import django.db.models.fields.json
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("evidence", "0002_tables_named_for_evidence"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="eventlog",
            index=models.Index(
                models.F("run"),
                django.db.models.fields.json.KeyTransform("step", "body"),
                condition=models.Q(("body__phase", "collective"), ("t", "progress")),
                name="eventlog_collective_step",
            ),
        ),
    ]
