"""The endpoint's statement for a delivery, one round trip (prepared on PostgreSQL, through
``workflows.statements``).

``insert_delivery`` writes a delivery row unless it is a second accepted row of the same (source,
event id): ``ON CONFLICT … DO NOTHING`` on the partial unique index waits for a concurrent insert of
the event to commit (then there is a conflict: False) or roll back (then this one is written), so
a duplicate is known without an error and a savepoint. Every field is written as Django's
``create`` would write it.
"""

from __future__ import annotations

from webhooks.models import Outcome, WebhookDelivery
from workflows.statements import insert_instance

ACCEPTED_ONCE = f"(source, event_id) WHERE outcome = '{Outcome.ACCEPTED}' DO NOTHING"


def insert_delivery(delivery: WebhookDelivery) -> bool:
    """Store ``delivery`` (its ``pk`` set); False, storing nothing, if it is an accepted row of an
    event that has one already."""
    return insert_instance(delivery, on_conflict=ACCEPTED_ONCE)
