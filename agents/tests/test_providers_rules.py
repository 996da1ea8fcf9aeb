"""The embedded rules model: its conversations round by round, with the tools' results fed back.

No database: the model is plain Python; a test plays the turn, answering each call itself.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from agents.providers import (
    ChatMessage,
    Finish,
    ModelEvent,
    ModelRequest,
    RulesProvider,
    TextDelta,
    ToolCall,
    ToolSpec,
)

SYSTEM = "You help customers of the shop."
ALL_TOOLS = tuple(
    ToolSpec(name, f"the example app's {name}", {"type": "object", "properties": {}})
    for name in ("find_order", "request_refund", "refund_status", "assessment_status")
)
REFUND_1042 = "I'd like a refund for order 1042 because it arrived damaged"
ORDER_1042 = {"number": "1042", "amount": "120.00", "currency": "GBP", "refundable": "120.00", "status": "placed"}
ASKED = {"request_id": 7, "amount": "120.00", "status": "awaiting approval"}


def ask(*messages: ChatMessage, tools: tuple[ToolSpec, ...] = ALL_TOOLS, prefix: str = "") -> list[ModelEvent]:
    events = list(RulesProvider().stream(ModelRequest(SYSTEM, messages, tools, prefix=prefix)))
    assert [e for e in events if isinstance(e, Finish)] == [events[-1]], "exactly one Finish, at the end"
    return events


def user(text: str) -> ChatMessage:
    return ChatMessage("user", text)


def answered(call: ToolCall, result: dict[str, Any]) -> tuple[ChatMessage, ChatMessage]:
    """The assistant's call and the tool's result, as the turn appends them."""
    return (
        ChatMessage("assistant", tool_calls=(call,)),
        ChatMessage("tool", json.dumps(result), tool_call_id=call.id, name=call.name),
    )


def only_call(events: list[ModelEvent]) -> ToolCall:
    assert len(events) == 2 and events[-1] == Finish("tool_calls")
    call = events[0]
    assert isinstance(call, ToolCall)
    return call


def text_of(events: list[ModelEvent]) -> str:
    assert events[-1] == Finish("stop")
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def say(text: str, *, tools: tuple[ToolSpec, ...] = ALL_TOOLS) -> str:
    return text_of(ask(user(text), tools=tools))


# -- a refund


def test_a_refund_looks_the_order_up_asks_for_it_and_says_what_became_of_it() -> None:
    # given
    message = user(REFUND_1042)

    # when round 1
    find = only_call(ask(message))
    # then
    assert find == ToolCall("rules-1-1-find_order", "find_order", {"number": "1042"})

    # when round 2
    request = only_call(ask(message, *answered(find, ORDER_1042)))
    # then
    assert request == ToolCall(
        "rules-1-2-request_refund",
        "request_refund",
        {"order": "1042", "amount": "120.00", "reason": "arrived damaged"},
    )

    # when round 3
    said = text_of(ask(message, *answered(find, ORDER_1042), *answered(request, ASKED)))
    # then
    assert said == (
        "I've asked for a refund of £120.00 on order 1042. It is awaiting approval; I'll tell you here when it changes."
    )


def test_the_amount_asked_for_wins_over_the_refundable_amount_and_a_missing_reason_is_not_given() -> None:
    # given
    message = user("Please refund £20 of order 1042")
    find = only_call(ask(message))

    # when
    request = only_call(ask(message, *answered(find, ORDER_1042)))

    # then
    assert request.arguments == {"order": "1042", "amount": "20.00", "reason": "not given"}


@pytest.mark.parametrize(
    "text, written",
    [
        ("Please refund order 1041 -5 pounds", "-5"),
        ("Refund order 1041 £1e1", "£1e1"),
        ("Refund order 1041 £5.005 please", "£5.005"),
        ("Refund order 1042 £150.001", "£150.001"),
        ("Refund order 1042 £-5", "£-5"),
        ("Refund order 1044 £12,50", "£12,50"),  # a decimal comma: not £1,250
        ("Refund order 1044 £1,5", "£1,5"),
        ("Refund order 1043 \u22125 pounds", "\u22125"),  # a minus sign, not a hyphen
        ("Refund order 1043 £\uff15", "£\uff15"),  # a full-width digit
    ],
)
def test_an_amount_that_does_not_read_exactly_is_asked_about_and_no_tool_is_called(text: str, written: str) -> None:
    # when the customer writes an amount that is not a positive amount with at most two decimals
    events = ask(user(text))

    # then no tool is called (no refund of some other amount), and the answer names what was written
    assert not [e for e in events if isinstance(e, ToolCall)]
    assert text_of(events).startswith(f"I couldn't read the amount {written!r}.")


def test_an_amount_in_another_currency_than_the_orders_is_asked_about() -> None:
    # given an order paid in pounds, and an amount written in dollars
    message = user("Please refund $20 of order 1042")
    find = only_call(ask(message))

    # when the order is known
    events = ask(message, *answered(find, ORDER_1042))

    # then nothing is asked for, and the answer says why
    assert not [e for e in events if isinstance(e, ToolCall)]
    assert text_of(events).startswith("Order 1042 was paid in GBP, and you wrote an amount in USD.")


@pytest.mark.parametrize(
    "text, stray",
    [
        ("I'd like a refund of 1.00 for order 1041 because it arrived damaged", "1.00"),
        ("Refund 5 on order 1042 please", "5"),
        ("Refund order 1042 because 2 of the cups broke", "2"),
        ("Refund order 1042 20", "20"),
    ],
)
def test_a_number_that_is_neither_the_order_nor_an_amount_with_its_currency_is_asked_about(
    text: str, stray: str
) -> None:
    # when the customer writes a number that might be the amount, without its currency
    events = ask(user(text))

    # then nothing is looked up or asked for (never a refund of all that is left instead), and the
    # answer names the number
    assert not [e for e in events if isinstance(e, ToolCall)]
    assert text_of(events).startswith(f"I'm not sure what {stray!r} is.")


def test_an_amount_written_with_an_iso_code_is_read_in_that_currency() -> None:
    # given an order paid in Swiss francs, and another paid in pounds
    message = user("I'd like a refund of 5 CHF for order 3001 because it arrived damaged")
    find = only_call(ask(message))
    assert find.arguments == {"number": "3001"}

    # then 5 CHF is asked for on the first, and asked about on the second
    francs = {**ORDER_1042, "number": "3001", "currency": "CHF"}
    request = only_call(ask(message, *answered(find, francs)))
    assert request.arguments is not None and request.arguments["amount"] == "5.00"
    events = ask(message, *answered(find, {**ORDER_1042, "number": "3001"}))
    assert text_of(events).startswith("Order 3001 was paid in GBP, and you wrote an amount in CHF.")


def test_an_amount_followed_by_a_comma_is_read_as_written() -> None:
    message = user("Refund order 1042, £20, thanks")
    find = only_call(ask(message))

    request = only_call(ask(message, *answered(find, ORDER_1042)))

    assert request.arguments is not None and request.arguments["amount"] == "20.00"


def test_the_refund_reports_the_amount_and_status_the_tool_gave() -> None:
    # given
    message = user(REFUND_1042)
    find = only_call(ask(message))
    request = only_call(ask(message, *answered(find, {**ORDER_1042, "currency": "EUR"})))

    # when
    said = text_of(
        ask(
            message,
            *answered(find, {**ORDER_1042, "currency": "EUR"}),
            *answered(request, {"request_id": 8, "amount": "99.5", "status": "confirmed"}),
        )
    )

    # then
    assert said == "I've asked for a refund of €99.50 on order 1042. It is confirmed."


def test_an_order_that_cannot_be_found_is_reported_in_words() -> None:
    # given
    message = user("refund order 999 please")
    find = only_call(ask(message))

    # then
    assert text_of(ask(message, *answered(find, {"error": "no such order."}))) == (
        "I couldn't find order 999: no such order."
    )


def test_a_refused_refund_is_reported_in_words() -> None:
    # given
    message = user(REFUND_1042)
    find = only_call(ask(message))
    request = only_call(ask(message, *answered(find, ORDER_1042)))

    # when
    said = text_of(ask(message, *answered(find, ORDER_1042), *answered(request, {"error": "too many open requests"})))

    # then
    assert said == "I couldn't ask for a refund on order 1042: too many open requests."


def test_an_order_with_nothing_left_to_refund_asks_for_nothing() -> None:
    # given
    message = user(REFUND_1042)
    find = only_call(ask(message))

    # then
    assert text_of(ask(message, *answered(find, {**ORDER_1042, "refundable": "0.00"}))) == (
        "Order 1042 has nothing left to refund."
    )


def test_a_tool_result_is_known_by_its_call_when_the_message_does_not_name_the_tool() -> None:
    # given
    message = user(REFUND_1042)
    find = only_call(ask(message))
    call, result = answered(find, ORDER_1042)

    # when
    events = ask(message, call, ChatMessage("tool", result.content, tool_call_id=find.id))

    # then
    assert only_call(events).name == "request_refund"


def test_a_refund_without_an_order_number_asks_which_order() -> None:
    assert say("I want a refund").startswith("Which order? Tell me its number")


def test_a_missing_tool_is_said_in_words_not_called() -> None:
    # given
    message = user(REFUND_1042)
    only_lookup = tuple(tool for tool in ALL_TOOLS if tool.name == "find_order")
    find = only_call(ask(message, tools=only_lookup))

    # then
    assert say(REFUND_1042, tools=()) == "I can't look up orders here, so I can't ask for a refund."
    assert text_of(ask(message, *answered(find, ORDER_1042), tools=only_lookup)) == (
        "Order 1042 can be refunded up to £120.00, but I can't ask for refunds here."
    )
    assert say("what's happening with my refund", tools=()) == "I can't look up refund requests here."
    assert say("how is the assessment of Acme going", tools=()) == "I can't look up supplier assessments here."


# -- the state of refunds and assessments


def test_the_customers_refunds_are_looked_up_and_told_in_words() -> None:
    # given
    message = user("what's happening with my refund")
    status = only_call(ask(message))
    requests = [
        {"request_id": 7, "order": "1042", "amount": "120.00", "status": "awaiting_approval"},
        {"request_id": 3, "order": "1001", "amount": "15", "status": "confirmed"},
    ]

    # when
    said = text_of(ask(message, *answered(status, {"requests": requests})))

    # then
    assert status == ToolCall("rules-1-1-refund_status", "refund_status", {})
    assert said == (
        "Your refund of 120.00 on order 1042 (request 7) is awaiting approval."
        " Your refund of 15.00 on order 1001 (request 3) is confirmed."
    )


def test_a_named_request_is_asked_for_and_no_requests_is_said() -> None:
    # given
    message = user("what is the status of refund request 7?")
    status = only_call(ask(message))

    # then
    assert status.arguments == {"request_id": 7}
    assert text_of(ask(message, *answered(status, {"requests": []}))) == "I found no refund requests of yours."


def test_the_assessment_of_a_supplier_is_looked_up_and_told_in_words() -> None:
    # given
    message = user("how is the assessment of Acme going")
    status = only_call(ask(message))

    # when
    said = text_of(
        ask(message, *answered(status, {"assessments": [{"id": 4, "supplier": "Acme", "status": "awaiting_review"}]}))
    )

    # then
    assert status == ToolCall("rules-1-1-assessment_status", "assessment_status", {"supplier": "Acme"})
    assert said == "The assessment of Acme (number 4) is awaiting review."
    assert text_of(ask(message, *answered(status, {"assessments": []}))) == "I found no assessment of Acme."


@pytest.mark.parametrize(
    ("text", "supplier"),
    [
        ("How's the review of Acme Ltd?", "Acme Ltd"),
        ("how is supplier Northwind Traders doing", "Northwind Traders"),
        ("assessment for acme", "acme"),
    ],
)
def test_the_supplier_is_read_from_the_question(text: str, supplier: str) -> None:
    assert only_call(ask(user(text))).arguments == {"supplier": supplier}


def test_an_assessment_without_a_supplier_asks_which() -> None:
    assert say("how are my assessments going?").startswith("Which supplier?")


# -- anything else


def test_a_greeting_gets_what_can_be_done_here() -> None:
    # given
    said = say("hello")

    # then
    assert said.startswith("Hello! I can ask for a refund")
    assert "how your refunds are going" in said and "supplier's assessment" in said
    assert say("hello", tools=ALL_TOOLS[2:3]) == (
        'Hello! I can tell you how your refunds are going ("what\'s happening with my refund?").'
    )
    assert say("hello", tools=()) == "Hello! I can't look anything up here, but I'm listening."


def test_the_latest_user_message_decides_and_ids_tell_the_turns_apart() -> None:
    # given a second turn after a first refund
    first = user(REFUND_1042)
    find = only_call(ask(first))
    request = only_call(ask(first, *answered(find, ORDER_1042)))
    done = text_of(ask(first, *answered(find, ORDER_1042), *answered(request, ASKED)))
    history = (first, *answered(find, ORDER_1042), *answered(request, ASKED), ChatMessage("assistant", done))

    # when
    status = only_call(ask(*history, user("what's happening with my refund")))

    # then
    assert status.id == "rules-2-1-refund_status"


# -- determinism and streaming


def test_the_same_conversation_gives_the_same_events() -> None:
    # given
    message = user(REFUND_1042)
    find = only_call(ask(message))

    # then
    assert ask(message) == ask(message)
    assert ask(message, *answered(find, ORDER_1042)) == ask(message, *answered(find, ORDER_1042))
    assert ask(user("hello")) == ask(user("hello"))


def test_the_answer_streams_a_word_at_a_time() -> None:
    # given
    events = ask(user("hello"))
    deltas = [e.text for e in events if isinstance(e, TextDelta)]

    # then
    assert len(deltas) > 10
    assert all(re.fullmatch(r"\S+ ?", delta) for delta in deltas)
    assert all(delta.endswith(" ") for delta in deltas[:-1])
    assert "".join(deltas) == text_of(events)


@pytest.mark.parametrize("cut", [1, 7, 20, 40, -1])
def test_a_recovered_answer_continues_after_the_text_already_delivered(cut: int) -> None:
    # given an answer cut anywhere, mid-word too
    full = say("hello")
    prefix = full[:cut]

    # when
    rest = text_of(ask(user("hello"), prefix=prefix))

    # then
    assert prefix + rest == full


def test_a_recovered_answer_on_word_boundaries_goes_on_word_by_word() -> None:
    # given
    deltas = [e.text for e in ask(user("hello")) if isinstance(e, TextDelta)]

    # when
    rest = [e.text for e in ask(user("hello"), prefix="".join(deltas[:5])) if isinstance(e, TextDelta)]

    # then
    assert rest == deltas[5:]


def test_a_recovered_round_that_calls_a_tool_calls_it_again_with_the_same_id() -> None:
    # given
    message = user(REFUND_1042)

    # then
    assert ask(message, prefix="anything") == ask(message)


def test_words_can_be_slowed_down(settings: Any) -> None:
    # given
    settings.AGENTS_RULES_WORD_DELAY = 0.01
    words = len([e for e in ask(user("hello")) if isinstance(e, TextDelta)])

    # when
    started = time.monotonic()
    ask(user("hello"))

    # then
    assert time.monotonic() - started >= words * 0.01
