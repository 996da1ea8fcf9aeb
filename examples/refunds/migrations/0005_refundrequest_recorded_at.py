from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps


def mark_the_recorded(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """The requests whose refund has its operational record now: recorded when it was."""
    RefundRequest = apps.get_model("refunds", "RefundRequest")
    OperationalRecord = apps.get_model("ledger", "OperationalRecord")
    records = OperationalRecord.objects.filter(tool="payments.refund").order_by("created_at")
    for request_id, created_at in records.values_list("request_id", "created_at"):
        prefix, _, pk = request_id.partition(":")
        if prefix == "refund-request" and pk.isdigit():
            RefundRequest.objects.filter(pk=int(pk), recorded_at__isnull=True).update(recorded_at=created_at)


class Migration(migrations.Migration):
    """RefundRequest.recorded_at: a refund recorded (and its order marked) once, however long after a
    run is restarted. The operational record, which said so before, is purged by age."""

    dependencies = [
        ("refunds", "0004_refundrequest_key_salt"),
        ("ledger", "0003_operationevent_abandon"),
    ]

    operations = [
        migrations.AddField(
            model_name="refundrequest",
            name="recorded_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.RunPython(mark_the_recorded, migrations.RunPython.noop, elidable=True),
    ]
