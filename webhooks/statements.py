"""The endpoint's two statements for an accepted delivery, one round trip each (prepared on
PostgreSQL, through ``workflows.statements.prepared_cursor``).

``insert_delivery`` writes a delivery row unless it is a second accepted row of the same (source,
event id): ``ON CONFLICT … DO NOTHING`` on the partial unique index waits for a concurrent insert of
the event to commit (then there is a conflict: None) or roll back (then this one is written), so
a duplicate is known without an error and a savepoint. ``record_result`` stores what the action
did on the accepted row. Every field is written as Django's ``create`` would write it.
"""

from __future__ import annotations

import functools
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from webhooks.models import Outcome, WebhookDelivery
from workflows.statements import prepared_cursor

TABLE = WebhookDelivery._meta.db_table
FIELDS = [f for f in WebhookDelivery._meta.concrete_fields if not f.primary_key]
RESULT_FIELDS = [f for f in FIELDS if f.name in ("run", "operation_key", "submission", "result")]


@functools.cache
def _insert_sql() -> str:
    columns = ", ".join(str(f.column) for f in FIELDS)
    placeholders = ", ".join(["%s"] * len(FIELDS))
    return (
        f"INSERT INTO {TABLE} ({columns}) VALUES ({placeholders}) "
        f"ON CONFLICT (source, event_id) WHERE outcome = '{Outcome.ACCEPTED}' DO NOTHING RETURNING id"
    )


@functools.cache
def _update_sql() -> str:
    assignments = ", ".join(f"{f.column} = %s" for f in RESULT_FIELDS)
    return f"UPDATE {TABLE} SET {assignments} WHERE id = %s"


def _prepared(delivery: WebhookDelivery, fields: list[Any]) -> list[Any]:
    db = connections[DEFAULT_DB_ALIAS]
    return [f.get_db_prep_save(f.pre_save(delivery, True), connection=db) for f in fields]


def insert_delivery(delivery: WebhookDelivery) -> bool:
    """Store ``delivery`` (its ``pk`` set); False, storing nothing, if it is an accepted row of an
    event that has one already."""
    with prepared_cursor() as cursor:
        cursor.execute(_insert_sql(), _prepared(delivery, FIELDS))
        row = cursor.fetchone()
    if row is None:
        return False
    delivery.pk = row[0]
    delivery._state.adding, delivery._state.db = False, DEFAULT_DB_ALIAS
    return True


def record_result(delivery: WebhookDelivery) -> None:
    """Write the delivery's run, operation key, submission and result as they are in memory."""
    with prepared_cursor() as cursor:
        cursor.execute(_update_sql(), [*_prepared(delivery, RESULT_FIELDS), delivery.pk])
