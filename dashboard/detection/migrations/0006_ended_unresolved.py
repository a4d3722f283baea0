"""A third state for alerts and incidents, "ended_unresolved": what the end of a run closed before it
got better. Alerts the run's end had resolved ("run ended") take it, and so do their incidents;
going back makes them resolved again."""

from django.db import migrations, models

STATES = [("firing", "firing"), ("resolved", "resolved"), ("ended_unresolved", "ended unresolved")]


def ended_unresolved(apps, schema_editor) -> None:
    Alert, Incident = apps.get_model("detection", "Alert"), apps.get_model("detection", "Incident")
    Alert.objects.filter(state="resolved", resolve_reason="run ended").update(state="ended_unresolved")
    ended = Alert.objects.filter(state="ended_unresolved").values("incident_id")
    Incident.objects.filter(state="resolved", id__in=ended).update(state="ended_unresolved")


def resolved(apps, schema_editor) -> None:
    for model in ("Alert", "Incident"):
        apps.get_model("detection", model).objects.filter(state="ended_unresolved").update(state="resolved")


class Migration(migrations.Migration):
    dependencies = [
        ("detection", "0005_tables_named_for_their_app"),
    ]

    operations = [
        migrations.AlterField(
            model_name="alert",
            name="state",
            field=models.CharField(choices=STATES, default="firing", max_length=16),
        ),
        migrations.AlterField(
            model_name="incident",
            name="state",
            field=models.CharField(choices=STATES, default="firing", max_length=16),
        ),
        migrations.RunPython(ended_unresolved, resolved),
    ]
