"""The endpoint's two statements for an accepted delivery, one round trip each (prepared on
PostgreSQL, through ``workflows.statements``).

``insert_delivery`` writes a delivery row unless it is a second accepted row of the same (source,
event id): ``ON CONFLICT … DO NOTHING`` on the partial unique index waits for a concurrent insert of
the event to commit (then there is a conflict: False) or roll back (then this one is written), so
a duplicate is known without an error and a savepoint. ``record_result`` stores what the action
did on the accepted row. Every field is written as Django's ``create`` and ``save`` would write it.
"""

from __future__ import annotations

from webhooks.models import Outcome, WebhookDelivery
from workflows.statements import insert_instance, update_instance

ACCEPTED_ONCE = f"(source, event_id) WHERE outcome = '{Outcome.ACCEPTED}' DO NOTHING"
RESULT_FIELDS = ("run", "operation_key", "submission", "result")


def insert_delivery(delivery: WebhookDelivery) -> bool:
    """Store ``delivery`` (its ``pk`` set); False, storing nothing, if it is an accepted row of an
    event that has one already."""
    return insert_instance(delivery, on_conflict=ACCEPTED_ONCE)


def record_result(delivery: WebhookDelivery) -> None:
    """Write the delivery's run, operation key, submission and result as they are in memory."""
    update_instance(delivery, RESULT_FIELDS)
