"""The tables follow their owner: `ingest_compileevent` becomes `evidence_compileevent`, and so on.

Every name PostgreSQL derived from an old table name goes with it: the daily partitions
(`<table>_pYYYYMMDD`), their indexes, primary keys, sequences and check or foreign key
constraints. `lockstep_raw_partition()` takes the parent's name as an argument, so its body
stays. The three indexes Django had named after the old table get names of their own. No row
moves; both directions only rename.
"""

from django.db import migrations

TABLES = (
    "blob",
    "compileevent",
    "eventlog",
    "flightrecord",
    "gradreport",
    "graphbreakevent",
    "ingestbatch",
    "stepreport",
)

# For each (old, new) table name: constraints named after the old one (renamed on the parent,
# PostgreSQL carries the partitions' inherited ones along), then every relation (the table, its
# partitions, indexes, sequences) whose name starts with it.
RENAME = """
DO $do$
DECLARE
  pair text[];
  r record;
BEGIN
  FOREACH pair SLICE 1 IN ARRAY ARRAY[%s] LOOP
    FOR r IN SELECT conname FROM pg_constraint
             WHERE conrelid = pair[1]::regclass AND contype IN ('c', 'f')
               AND (conname = pair[1] OR left(conname, length(pair[1]) + 1) = pair[1] || '_') LOOP
      EXECUTE format('ALTER TABLE %%I RENAME CONSTRAINT %%I TO %%I', pair[1], r.conname,
                     pair[2] || substr(r.conname, length(pair[1]) + 1));
    END LOOP;
    FOR r IN SELECT c.relname, c.relkind FROM pg_class c
             WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p', 'i', 'I', 'S')
               AND (c.relname = pair[1] OR left(c.relname, length(pair[1]) + 1) = pair[1] || '_') LOOP
      EXECUTE format('ALTER %%s %%I RENAME TO %%I',
                     CASE WHEN r.relkind IN ('i', 'I') THEN 'INDEX' WHEN r.relkind = 'S' THEN 'SEQUENCE' ELSE 'TABLE' END,
                     r.relname, pair[2] || substr(r.relname, length(pair[1]) + 1));
    END LOOP;
  END LOOP;
END
$do$;
"""


def _rename(old: str, new: str) -> str:
    return RENAME % ", ".join(f"ARRAY['{old}_{t}', '{new}_{t}']" for t in TABLES)


class Migration(migrations.Migration):
    dependencies = [
        ("evidence", "0001_initial"),
        ("ingest", "0012_split_evidence"),
    ]

    operations = [
        migrations.RenameIndex(
            model_name="compileevent", new_name="compileevent_run_frame", old_name="ingest_comp_run_id_864131_idx"
        ),
        migrations.RenameIndex(
            model_name="gradreport", new_name="gradreport_run_step", old_name="ingest_grad_run_id_9dcac6_idx"
        ),
        migrations.RenameIndex(
            model_name="stepreport", new_name="stepreport_run_rank", old_name="ingest_step_run_id_6f9648_idx"
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(_rename("ingest", "evidence"), _rename("evidence", "ingest"))],
            state_operations=[migrations.AlterModelTable(name=t, table=None) for t in TABLES],
        ),
    ]
