"""The detection, delivery and slot tables now belong to the apps `detection`, `delivery` and `ledger`.

The tables stay where they are (`db_table`): this only hands Django's model state over.
The one schema change: a detail request's alert is a plain id (no foreign key to the alert table).
"""

from django.db import migrations

from dashboard.migrations._relabel import move_content_types

MOVED = {
    "compileslot": "ledger",
    "gradslot": "ledger",
    "detailrequest": "ledger",
    "alert": "detection",
    "silence": "detection",
    "baseline": "detection",
    "webhook": "delivery",
    "notification": "delivery",
}


# A detail request keeps the id of the alert that asked, without a foreign key: the ledger sits below detection.
DROP_ALERT_FK = """
DO $$ DECLARE c text; BEGIN
  FOR c IN SELECT conname FROM pg_constraint
           WHERE conrelid = 'dashboard_detailrequest'::regclass AND contype = 'f'
             AND confrelid = 'dashboard_alert'::regclass LOOP
    EXECUTE format('ALTER TABLE dashboard_detailrequest DROP CONSTRAINT %I', c);
  END LOOP;
END $$;
"""
ADD_ALERT_FK = """
ALTER TABLE dashboard_detailrequest ADD CONSTRAINT dashboard_detailrequest_alert_id_fk
  FOREIGN KEY (alert_id) REFERENCES dashboard_alert (id) DEFERRABLE INITIALLY DEFERRED;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0001_initial"),
        ("detection", "0001_initial"),
        ("delivery", "0001_initial"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("dashboard", "0004_settled_slot_index"),
    ]

    state_operations = [
        migrations.RemoveField(
            model_name="notification",
            name="alert",
        ),
        migrations.RemoveField(
            model_name="detailrequest",
            name="alert",
        ),
        migrations.RemoveField(
            model_name="baseline",
            name="baseline",
        ),
        migrations.RemoveField(
            model_name="baseline",
            name="chosen_by",
        ),
        migrations.RemoveField(
            model_name="baseline",
            name="run",
        ),
        migrations.RemoveField(
            model_name="compileslot",
            name="run",
        ),
        migrations.RemoveField(
            model_name="detailrequest",
            name="run",
        ),
        migrations.RemoveField(
            model_name="gradslot",
            name="run",
        ),
        migrations.RemoveField(
            model_name="notification",
            name="webhook",
        ),
        migrations.RemoveField(
            model_name="silence",
            name="author",
        ),
        migrations.RemoveField(
            model_name="silence",
            name="project",
        ),
        migrations.RemoveField(
            model_name="silence",
            name="run",
        ),
        migrations.RemoveField(
            model_name="webhook",
            name="project",
        ),
        migrations.DeleteModel(
            name="Alert",
        ),
        migrations.DeleteModel(
            name="Baseline",
        ),
        migrations.DeleteModel(
            name="CompileSlot",
        ),
        migrations.DeleteModel(
            name="DetailRequest",
        ),
        migrations.DeleteModel(
            name="GradSlot",
        ),
        migrations.DeleteModel(
            name="Notification",
        ),
        migrations.DeleteModel(
            name="Silence",
        ),
        migrations.DeleteModel(
            name="Webhook",
        ),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=state_operations),
        migrations.RunSQL(DROP_ALERT_FK, ADD_ALERT_FK),
        move_content_types("dashboard", MOVED),
    ]
