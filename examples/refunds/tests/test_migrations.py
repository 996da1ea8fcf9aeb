"""Migration 0004 gives the refund requests made before it no salt: their ledger keys, which the
provider and the ledger hold, stay as they were; the requests made after it each get one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from examples.refunds.models import RefundRequest
from tests.factories import Users

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE, AFTER = ("refunds", "0003_refundrequest_agent"), ("refunds", "0004_refundrequest_key_salt")


@pytest.fixture
def before_the_salt() -> Iterator[MigrationExecutor]:
    executor = MigrationExecutor(connection)
    executor.migrate([BEFORE])
    try:
        yield executor
    finally:
        executor = MigrationExecutor(connection)  # the graph as it stands now
        executor.migrate(executor.loader.graph.leaf_nodes())


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

    # when the migration runs
    executor = MigrationExecutor(connection)
    executor.migrate([AFTER])

    # then both keep the key they had, without a salt
    for request in RefundRequest.objects.filter(pk__in=[r.pk for r in made]).select_related("order"):
        assert request.key_salt == ""
        assert request.operation_key == f"refund:2001:{request.pk}"
    # and requests made from then on each have a salt of their own in their key
    new = [RefundRequest.objects.create(order_id=order.pk, customer=users.alice, amount="5") for _ in range(2)]
    assert all(len(r.key_salt) == 12 for r in new) and new[0].key_salt != new[1].key_salt
    assert new[0].operation_key == f"refund:2001:{new[0].pk}:{new[0].key_salt}"
