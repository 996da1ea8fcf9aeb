"""Migration 0004 gives the refund requests made before it no salt: their ledger keys, which the
provider and the ledger hold, stay as they were; the requests made after it each get one.
Migration 0005 marks recorded the requests whose refund has its operational record."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from examples.refunds.models import RefundRequest
from tests.factories import Users

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = ("refunds", "0003_refundrequest_agent")
BEFORE_THE_MARK = ("refunds", "0004_refundrequest_key_salt")


def migrate_to_the_end() -> None:
    executor = MigrationExecutor(connection)  # the graph as it stands now
    executor.migrate(executor.loader.graph.leaf_nodes())


def migrated_back_to(target: tuple[str, str]) -> Iterator[MigrationExecutor]:
    executor = MigrationExecutor(connection)
    executor.migrate([target])
    try:
        yield executor
    finally:
        migrate_to_the_end()


@pytest.fixture
def before_the_salt() -> Iterator[MigrationExecutor]:
    yield from migrated_back_to(BEFORE)


@pytest.fixture
def before_the_mark() -> Iterator[MigrationExecutor]:
    yield from migrated_back_to(BEFORE_THE_MARK)


def test_requests_made_before_the_salt_keep_their_keys_and_new_ones_get_a_salt_each(
    before_the_salt: MigrationExecutor, users: Users
) -> None:
    # given two requests stored before the migration, by the models as they were
    old = before_the_salt.loader.project_state([BEFORE]).apps
    order = old.get_model("refunds", "Order").objects.create(number="2001", customer_id=users.alice.pk, amount="50")
    made = [
        old.get_model("refunds", "RefundRequest").objects.create(order=order, customer_id=users.alice.pk, amount="5")
        for _ in range(2)
    ]

    # when the migrations run
    migrate_to_the_end()

    # then both keep the key they had, without a salt
    for request in RefundRequest.objects.filter(pk__in=[r.pk for r in made]).select_related("order"):
        assert request.key_salt == ""
        assert request.operation_key == f"refund:2001:{request.pk}"
    # and requests made from then on each have a salt of their own in their key
    new = [RefundRequest.objects.create(order_id=order.pk, customer=users.alice, amount="5") for _ in range(2)]
    assert all(len(r.key_salt) == 12 for r in new) and new[0].key_salt != new[1].key_salt
    assert new[0].operation_key == f"refund:2001:{new[0].pk}:{new[0].key_salt}"


def test_requests_whose_refund_was_recorded_before_the_mark_are_marked_recorded(
    before_the_mark: MigrationExecutor, users: Users
) -> None:
    from ledger import record_create

    # given two requests stored before the migration, one with its refund recorded
    old = before_the_mark.loader.project_state([BEFORE_THE_MARK]).apps
    order = old.get_model("refunds", "Order").objects.create(number="2002", customer_id=users.alice.pk, amount="50")
    recorded, not_recorded = (
        old.get_model("refunds", "RefundRequest").objects.create(order=order, customer_id=users.alice.pk, amount="5")
        for _ in range(2)
    )
    record = record_create(request_id=f"refund-request:{recorded.pk}", tool="payments.refund", step="refund")
    record_create(request_id=f"refund-request:{not_recorded.pk}", tool="payments.lookup", step="other")

    # when the migrations run
    migrate_to_the_end()

    # then the one with its refund's record is recorded as of the record, the other not
    marks = dict(RefundRequest.objects.filter(order_id=order.pk).values_list("pk", "recorded_at"))
    assert marks == {recorded.pk: record.created_at, not_recorded.pk: None}
