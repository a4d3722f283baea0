"""`Rank.facts_key`, `Rank.device` and `Rank.collective_timeout_s`: a rank's shared start facts by key,
its GPU and its collective timeout as plain columns, filled for the ranks already stored
(`sql.ranks_seen_cte` keeps them from then on).

A real rank's `facts` (its settings, environment, cache locations: about a kilobyte) goes out of line
past the table's 512-byte tuple target (`0002_rank_facts`), so every read of it fetches and
decompresses a TOAST value: a compile settle that read every rank's cost 3 s at 100,000 ranks, and
the sweep's shortest collective timeout 0.4 s each second. The ranks of one job share all of it but
a few values of their own (`OWN_FACTS`); grouped by key, the facts are read once per distinct key.
Adding the columns with a constant default rewrites nothing; the fill rewrites the rows that have
facts once."""

from django.db import migrations, models

OWN = "'{host,device,pid,local_rank,ts,links}'::text[]"


class Migration(migrations.Migration):
    dependencies = [
        ("tenancy", "0003_rank_progress"),
    ]

    operations = [
        migrations.AddField(
            model_name="rank",
            name="facts_key",
            field=models.CharField(default="", max_length=32),
        ),
        migrations.AddField(
            model_name="rank",
            name="device",
            field=models.CharField(default="", max_length=512),
        ),
        migrations.AddField(
            model_name="rank",
            name="collective_timeout_s",
            field=models.FloatField(null=True),
        ),
        migrations.RunSQL(
            f"UPDATE tenancy_rank SET facts_key = md5((facts - {OWN})::text), device = COALESCE(facts ->> 'device', ''),"
            " collective_timeout_s = (facts ->> 'collective_timeout_s')::float8 WHERE facts <> '{}'::jsonb",
            migrations.RunSQL.noop,
        ),
    ]
