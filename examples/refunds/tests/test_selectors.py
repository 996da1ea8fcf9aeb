"""The customer's reads: their own orders and refund requests, and nobody else's.

Rows are written through the services in the test's transaction; a request's run is never
enqueued (its enqueue waits for a commit that never comes), so no worker is involved.
"""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import AnonymousUser

from examples.refunds.selectors import order_get, refund_request_get, refund_requests_for
from examples.refunds.services import refund_request_create
from examples.refunds.tests.support import new_order
from tests.factories import Users

pytestmark = pytest.mark.django_db


def test_order_get_finds_the_customers_own_order_only(users: Users) -> None:
    # given
    order = new_order(users.alice, "3001")

    # then
    assert order_get(user=users.alice, number="3001") == order
    assert order_get(user=users.mallory, number="3001") is None  # another's: as if it did not exist
    assert order_get(user=AnonymousUser(), number="3001") is None
    assert order_get(user=users.alice, number="3002") is None


def test_refund_requests_are_their_customers_own(users: Users) -> None:
    # given
    order = new_order(users.alice, "3001")
    first, _ = refund_request_create(order=order, customer=users.alice, amount="10.00")
    second, _ = refund_request_create(order=order, customer=users.alice, amount="20.00")

    # then
    assert refund_request_get(user=users.alice, request_id=first.pk) == first
    assert refund_request_get(user=users.mallory, request_id=first.pk) is None
    assert refund_request_get(user=AnonymousUser(), request_id=first.pk) is None
    assert list(refund_requests_for(user=users.alice)) == [second, first]  # newest first
    assert not refund_requests_for(user=users.mallory).exists()
    assert not refund_requests_for(user=AnonymousUser()).exists()


def test_the_tools_tell_and_do_nothing_when_no_person_asked(users: Users) -> None:
    # given alice's order, and a message to her account's agent that no person sent (a schedule's)
    from agents import ToolContext
    from agents.tests.support import chat_agent
    from examples.refunds.models import RefundRequest
    from examples.refunds.tools import find_order, refund_status, request_refund

    new_order(users.alice, "1042", "150.00")
    ctx = ToolContext(agent=chat_agent(users.alice), turn_id="t", call_id="c", user=None)

    # then each tool answers why it tells nothing, and asks for nothing
    answers = [find_order(ctx, "1042"), request_refund(ctx, "1042", "10.00", "damaged"), refund_status(ctx)]
    assert answers == [{"error": ToolContext.NO_ONE_ASKED}] * 3
    assert not RefundRequest.objects.exists()


def test_the_refund_status_tool_gives_each_requests_currency_and_the_answer_says_it(users: Users) -> None:
    # given alice's refund request on an order in pounds
    from agents import ToolContext
    from agents.providers.base import ChatMessage, ModelRequest, ToolCall
    from agents.providers.rules import RulesProvider
    from agents.tests.support import chat_agent
    from examples.refunds.tools import refund_status

    order = new_order(users.alice, "1041", "25.00")
    request, _ = refund_request_create(order=order, customer=users.alice, amount="1.00", reason="chipped")
    ctx = ToolContext(agent=chat_agent(users.alice), turn_id="t", call_id="c", user=users.alice)

    # when she asks where it is, and the embedded model reads the tool's answer
    result = refund_status(ctx)
    call = ToolCall(id="rules-1-0-refund_status", name="refund_status", arguments={})
    messages = (
        ChatMessage("user", "what's happening with my refund?"),
        ChatMessage("assistant", tool_calls=(call,)),
        ChatMessage("tool", json.dumps(result), tool_call_id=call.id, name=call.name),
    )
    events = RulesProvider().stream(ModelRequest("", messages, ()))
    text = "".join(getattr(e, "text", "") for e in events)

    # then the amount is in her order's currency, as the answer to asking for it was
    assert result["requests"][0]["currency"] == "GBP"
    assert text.startswith(f"Your refund of £1.00 on order 1041 (request {request.pk}) is"), text
