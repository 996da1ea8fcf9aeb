"""The endpoint's two statements for an accepted delivery, one round trip each (prepared on
PostgreSQL, through ``workflows.statements``).

``insert_accepted`` writes an accepted delivery row unless the source has one of the same event id,
or of the same replay key where the scheme signs the body only: ``ON CONFLICT DO NOTHING`` waits
for a concurrent insert of the event to commit (then there is a conflict: False) or roll back
(then this one is written), so a duplicate is known without an error and a savepoint. It has no
conflict target, because there are two such partial unique indexes, so a clash on the primary key
(a sequence behind its table, after a restore) would read as a conflict too: the caller confirms
that an accepted row is there (``services._record_duplicate``). ``insert_delivery`` writes any
other row, with no ON CONFLICT. ``record_result`` stores what the action did on the accepted row.
Every field is written as Django's ``create`` and ``save`` would write it.
"""

from __future__ import annotations

from webhooks.models import WebhookDelivery
from workflows.statements import insert_instance, update_instance

# No conflict target: both partial unique indexes of accepted rows (ACCEPTED_ONCE, SIGNED_BODY_ONCE).
ON_EITHER_INDEX = "DO NOTHING"
RESULT_FIELDS = ("run", "operation_key", "submission", "result")


def insert_accepted(delivery: WebhookDelivery) -> bool:
    """Store the accepted ``delivery`` (its ``pk`` set); False, storing nothing, if the source has
    an accepted row of its event (or, ``replay_key`` set, of its body) already."""
    return insert_instance(delivery, on_conflict=ON_EITHER_INDEX)


def insert_delivery(delivery: WebhookDelivery) -> None:
    """Store a duplicate (or any row but an accepted one): an error, not nothing, if it cannot be."""
    insert_instance(delivery)


def record_result(delivery: WebhookDelivery) -> None:
    """Write the delivery's run, operation key, submission and result as they are in memory."""
    update_instance(delivery, RESULT_FIELDS)
