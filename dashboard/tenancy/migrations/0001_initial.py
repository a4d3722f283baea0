"""Projects, tokens, runs and ranks, formerly models of `ingest`. The tables stay where they are (`db_table`): this only hands Django's model state over."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("ingest", "0004_grad_report_ranks"),
        ("dashboard", "0004_settled_slot_index"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    state_operations = [
        migrations.CreateModel(
            name="Project",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.SlugField(max_length=100, unique=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("members", models.ManyToManyField(blank=True, related_name="projects", to=settings.AUTH_USER_MODEL)),
            ],
            options={
                "db_table": "ingest_project",
            },
        ),
        migrations.CreateModel(
            name="ProjectToken",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("digest", models.CharField(max_length=64, unique=True)),
                ("prefix", models.CharField(max_length=12)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "project",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="tokens", to="tenancy.project"
                    ),
                ),
            ],
            options={
                "db_table": "ingest_projecttoken",
            },
        ),
        migrations.CreateModel(
            name="Run",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("key", models.CharField(max_length=200, unique=True)),
                ("name", models.CharField(blank=True, max_length=512)),
                ("world_size", models.PositiveIntegerField()),
                ("meta", models.JSONField(default=dict)),
                ("torch_version", models.CharField(blank=True, max_length=64)),
                ("started_at", models.DateTimeField(auto_now_add=True)),
                ("last_seen", models.DateTimeField(auto_now=True)),
                ("last_step", models.BigIntegerField(null=True)),
                (
                    "project",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="runs", to="tenancy.project"
                    ),
                ),
            ],
            options={
                "db_table": "ingest_run",
                "ordering": ["-started_at"],
            },
        ),
        migrations.CreateModel(
            name="Rank",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("rank", models.PositiveIntegerField()),
                ("host", models.CharField(blank=True, max_length=512)),
                ("pid", models.BigIntegerField(null=True)),
                ("info", models.JSONField(default=dict)),
                ("status", models.CharField(default="running", max_length=16)),
                ("exit_code", models.IntegerField(null=True)),
                ("last_step", models.BigIntegerField(null=True)),
                ("last_seen", models.DateTimeField(auto_now=True)),
                (
                    "run",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="ranks", to="tenancy.run"
                    ),
                ),
            ],
            options={
                "db_table": "ingest_rank",
                "ordering": ["rank"],
                "constraints": [models.UniqueConstraint(fields=("run", "rank"), name="rank_per_run")],
            },
        ),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=state_operations),
    ]
