"""The endpoint's two statements for an accepted delivery, one round trip each (prepared on
PostgreSQL, through ``workflows.statements``).

``insert_delivery`` writes a delivery row unless it is a second accepted row of the same (source,
event id), or of the same (source, replay key) where the scheme signs the body only: ``ON CONFLICT
DO NOTHING`` on those partial unique indexes (the table's only unique ones but its key) waits for a
concurrent insert of the event to commit (then there is a conflict: False) or roll back (then this
one is written), so a duplicate is known without an error and a savepoint. ``record_result`` stores what the action
did on the accepted row. Every field is written as Django's ``create`` and ``save`` would write it.
"""

from __future__ import annotations

from webhooks.models import WebhookDelivery
from workflows.statements import insert_instance, update_instance

# No conflict target: both partial unique indexes of accepted rows (ACCEPTED_ONCE, SIGNED_BODY_ONCE).
ACCEPTED_ONCE = "DO NOTHING"
RESULT_FIELDS = ("run", "operation_key", "submission", "result")


def insert_delivery(delivery: WebhookDelivery) -> bool:
    """Store ``delivery`` (its ``pk`` set); False, storing nothing, if it is an accepted row of an
    event (or, ``replay_key`` set, of a body) that has one already."""
    return insert_instance(delivery, on_conflict=ACCEPTED_ONCE)


def record_result(delivery: WebhookDelivery) -> None:
    """Write the delivery's run, operation key, submission and result as they are in memory."""
    update_instance(delivery, RESULT_FIELDS)
