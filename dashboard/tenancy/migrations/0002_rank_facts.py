"""`Rank.facts`: a rank's start facts without the model's parameter layout, filled for the ranks
already stored (`sql.ranks_seen_cte` keeps it from then on); and the rank's row kept small.

Each batch updates its rank's row (HOT, `0001_initial`), and PostgreSQL copies the whole row each
time; it moves a long value out of the row only past about 2 kB, so a real model's layout in
`info` (a few kB, compressed to one or two) stayed in every row: each update copied it, and every
read of the run's ranks (the sweep, a compile settle) scanned it. At 512 bytes it goes out of line,
where an update copies an 18-byte pointer; `facts` stays in the row."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenancy", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="rank",
            name="facts",
            field=models.JSONField(default=dict),
        ),
        migrations.RunSQL(
            "ALTER TABLE tenancy_rank SET (toast_tuple_target = 512)",
            "ALTER TABLE tenancy_rank RESET (toast_tuple_target)",
        ),
        migrations.RunSQL(
            "UPDATE tenancy_rank SET facts = info - '{params,buckets}'::text[] WHERE info <> '{}'::jsonb",
            migrations.RunSQL.noop,
        ),
    ]
