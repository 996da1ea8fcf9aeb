from django.db import migrations, models

# A submission that left pending had its turn started, and its messages joined the conversation
# then; one cancelled while pending never had (its turn was cancelled while queued, never started).
BACKFILL = """
UPDATE agents_submission SET delivered_at = (
    SELECT started_at FROM agents_turn WHERE agents_turn.id = agents_submission.turn_id
) WHERE status <> 'pending'
"""


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0005_submission_caller"),
    ]

    operations = [
        migrations.AddField(
            model_name="submission",
            name="delivered_at",
            field=models.DateTimeField(
                blank=True,
                help_text="When its turn started and its messages joined the conversation; empty if they never did.",
                null=True,
            ),
        ),
        migrations.RunSQL(BACKFILL, reverse_sql=migrations.RunSQL.noop),
    ]
