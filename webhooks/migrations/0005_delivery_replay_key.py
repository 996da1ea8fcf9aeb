"""The replay key of a delivery to a github-scheme source, unique among the source's accepted rows.

The unique index is built CONCURRENTLY on PostgreSQL: a plain build holds a lock that stops every
insert into the deliveries table (every webhook's answer) for as long as it scans a month of
deliveries. The model state gets the constraint as Django would add it; SQLite, the demo's
database, builds it the plain way.
"""

from django.db import migrations, models

NAME = "webhook_signed_body_once"
CONSTRAINT = models.UniqueConstraint(
    condition=models.Q(("outcome", "accepted"), models.Q(("replay_key", ""), _negated=True)),
    fields=("source", "replay_key"),
    name=NAME,
)


def build(apps, schema_editor):
    model = apps.get_model("webhooks", "WebhookDelivery")
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.add_constraint(model, CONSTRAINT)
        return
    table = schema_editor.quote_name(model._meta.db_table)
    schema_editor.execute(
        f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {schema_editor.quote_name(NAME)} ON {table} "
        "(source, replay_key) WHERE (outcome = 'accepted' AND NOT (replay_key = ''))"
    )


def drop(apps, schema_editor):
    model = apps.get_model("webhooks", "WebhookDelivery")
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.remove_constraint(model, CONSTRAINT)
        return
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(NAME)}")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("webhooks", "0004_delivery_body_digest"),
    ]

    operations = [
        migrations.AddField(
            model_name="webhookdelivery",
            name="replay_key",
            field=models.CharField(blank=True, db_default="", default="", max_length=64),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddConstraint(model_name="webhookdelivery", constraint=CONSTRAINT)],
            database_operations=[migrations.RunPython(build, drop)],
        ),
    ]
