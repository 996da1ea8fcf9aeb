"""A refund asked for in words, in the support agent's chat, end to end: the turn runs with the
embedded rules model in a real worker, the refund's run against the sandbox provider, and the chat
is told each change of the request's state exactly once."""

from __future__ import annotations

import asyncio
import threading
import time
from decimal import Decimal
from typing import Any

import pytest
from channels.layers import get_channel_layer

from accounts.services import account_ensure
from agents.models import Agent, Chunk, Turn, TurnStatus
from agents.selectors import agent_get
from agents.services import message_send
from agents.streams import group_name
from agents.tests.support import wait_ended
from approvals import decide
from examples.refunds.models import RefundRequest
from examples.refunds.tests.conftest import World
from examples.refunds.tests.support import assert_confirmed, new_order, pending_approval, run_of
from tests.factories import Users
from tests.support import wait_for
from workflows.models import StepResult

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ASK = "I'd like a refund for order 1042 because it arrived damaged"


def support_agent(*users: Any, account: str = "acme") -> Agent:
    """The account (acme: alice and bob) and its support agent ``help``, as its first member sees it."""
    account_ensure(slug=account, members=list(users))
    agent = agent_get(user=users[0], kind="support", name="help")
    assert agent is not None
    return agent


def tool_calls(turn: Turn) -> list[str]:
    return [c.data["toolName"] for c in Chunk.objects.filter(turn=turn, type="tool-input-available").order_by("seq")]


def call_id(turn: Turn, tool: str) -> str:
    chunk = Chunk.objects.get(turn=turn, type="tool-input-available", data__toolName=tool)
    return str(chunk.data["toolCallId"])


def refund_state(agent: Agent, request: RefundRequest) -> dict[str, Any] | None:
    state = Agent.objects.get(pk=agent.pk).state
    entry = state.get("refunds", {}).get(str(request.pk))
    return entry if isinstance(entry, dict) else None


def wait_state(agent: Agent, request: RefundRequest, status: str) -> dict[str, Any]:
    def says() -> dict[str, Any] | None:
        entry = refund_state(agent, request)
        return entry if entry is not None and entry["status"] == status else None

    return wait_for(says, timeout=40, what=f"the chat's state to say {status!r}")


class Pushes:
    """What the agent's clients receive: a channel in the agent's group, read when asked. On an
    event loop of its own that lasts the test, as a server's does (the pub/sub layer's channels and
    subscriptions belong to the loop that made them)."""

    def __init__(self, agent: Agent) -> None:
        self.layer: Any = get_channel_layer()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.channel: str = self.call(self.layer.new_channel())
        self.call(self.layer.group_add(group_name(agent.pk), self.channel))
        self.received: list[dict[str, Any]] = []
        self.reader = asyncio.run_coroutine_threadsafe(self.read(), self.loop)

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    async def read(self) -> None:
        while True:
            self.received.append(await self.layer.receive(self.channel))

    def drain(self, quiet: float = 1.0) -> None:
        """Wait until nothing more arrives for ``quiet`` seconds, then stop listening."""
        count = -1
        while count != len(self.received):
            count = len(self.received)
            time.sleep(quiet)
        self.loop.call_soon_threadsafe(self.reader.cancel)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def states(self, request: RefundRequest) -> list[str]:
        return [
            m["state"]["refunds"][str(request.pk)]["status"]
            for m in self.received
            if m["type"] == "agent.state" and str(request.pk) in m["state"].get("refunds", {})
        ]


def test_alice_asks_in_words_carol_approves_and_the_chat_hears_each_change_once(world: World, users: Users) -> None:
    # given alice's order 1042 (£150, above the approval limit) and her account's support agent
    new_order(users.alice, "1042", "150.00")
    agent = support_agent(users.alice, users.bob)
    pushes = Pushes(agent)

    # when she asks for a refund in words
    turn = wait_ended(message_send(agent=agent, user=users.alice, text=ASK), timeout=60)

    # then the rules model looked the order up and asked for the refund, once each
    assert turn.status == TurnStatus.COMPLETED, turn.end_reason
    assert tool_calls(turn) == ["find_order", "request_refund"]
    request = RefundRequest.objects.get()
    assert request.idempotency_key == f"agent:{agent.pk}:turn:{turn.pk}:call:{call_id(turn, 'request_refund')}"
    assert (request.customer, request.agent_id, request.amount) == (users.alice, agent.pk, Decimal("150.00"))
    assert request.reason == "arrived damaged"
    # and the answer says it awaits approval, as the chat's state soon does
    assert turn.text == (
        "I've asked for a refund of £150.00 on order 1042. It is awaiting approval; I'll tell you here when it changes."
    )
    entry = wait_state(agent, request, "awaiting approval")
    assert entry == {"order": "1042", "amount": "150.00", "currency": "GBP", "status": "awaiting approval"}

    # when carol approves it
    approval = pending_approval(request)
    decide(approval, by=users.carol, approve=True, version=approval.version)

    # then the provider refunded it once, and the chat says confirmed
    assert_confirmed(request, world.sandbox)
    assert wait_state(agent, request, "confirmed")["amount"] == "150.00"
    # each change told once (one atomic step each), and pushed to the agent's clients in order
    told = list(
        StepResult.objects.filter(run_id=run_of(request), name__startswith="tell the chat")
        .order_by("position")
        .values_list("name", flat=True)
    )
    assert told == ["tell the chat: awaiting approval", "tell the chat: submitted", "tell the chat: confirmed"]
    assert Agent.objects.get(pk=agent.pk).state_version == 3
    pushes.drain()
    assert pushes.states(request) == ["awaiting approval", "submitted", "confirmed"]
    # and the turn's tools ran once: one request, no second turn
    assert RefundRequest.objects.count() == 1 and Turn.objects.filter(agent=agent).count() == 1


@pytest.mark.parametrize("who", ["mallory", "bob"])
def test_only_the_customer_may_ask_about_their_order(world: World, users: Users, who: str) -> None:
    """Orders are the customer's own: mallory (another account) and bob (alice's colleague, same
    account and agent) are both told it is not theirs, and nothing is asked for."""
    new_order(users.alice, "1042", "150.00")
    asker = getattr(users, who)
    agent = support_agent(users.alice, users.bob) if who == "bob" else support_agent(asker, account="globex")
    if who == "bob":
        assert agent_get(user=users.bob, kind="support", name="help") == agent  # the account's agent

    turn = wait_ended(message_send(agent=agent, user=asker, text=ASK), timeout=60)

    assert turn.status == TurnStatus.COMPLETED, turn.end_reason
    assert tool_calls(turn) == ["find_order"]
    assert turn.text == "I couldn't find order 1042: You have no order 1042."
    assert not RefundRequest.objects.exists()
    assert Agent.objects.get(pk=agent.pk).state == {}


def test_a_refund_run_terminated_while_awaiting_approval_tells_the_chat_it_could_not_be_completed(
    world: World, users: Users
) -> None:
    # given a refund asked for in the chat, awaiting approval
    from workflows.services import run_terminate

    new_order(users.alice, "1042", "150.00")
    agent = support_agent(users.alice)
    wait_ended(message_send(agent=agent, user=users.alice, text=ASK), timeout=60)
    request = RefundRequest.objects.get()
    wait_state(agent, request, "awaiting approval")

    # when staff terminate its run (its last report, after the payment, will never come)
    run_terminate(run_id=run_of(request))

    # then the chat hears where the request stands, in the same words as everywhere else
    entry = refund_state(agent, request)
    assert entry == {"order": "1042", "amount": "150.00", "currency": "GBP", "status": "could not be completed"}
