from django.db import migrations, models

import examples.refunds.models


class Migration(migrations.Migration):
    """A random salt in each new refund's ledger key (RefundRequest.key_salt). The requests made
    before it get "" (their keys, which the provider and the ledger hold, stay as they were): a
    callable default in AddField would give them all one value, and change every key."""

    dependencies = [
        ("refunds", "0003_refundrequest_agent"),
    ]

    operations = [
        migrations.AddField(
            model_name="refundrequest",
            name="key_salt",
            field=models.CharField(blank=True, default="", editable=False, max_length=16),
        ),
        migrations.AlterField(
            model_name="refundrequest",
            name="key_salt",
            field=models.CharField(
                blank=True, default=examples.refunds.models.new_key_salt, editable=False, max_length=16
            ),
        ),
    ]
