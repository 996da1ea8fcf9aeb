"""The OpenAI-compatible provider against a fake server with each quirk and failure real servers show.

No database: the provider is plain Python and the fake server a thread of this process.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from agents.providers import (
    ChatMessage,
    Finish,
    ModelEvent,
    ModelRequest,
    OpenAIProvider,
    ProviderError,
    TextDelta,
    ToolCall,
    ToolSpec,
    get_provider,
)
from agents.providers.openai import stream_events
from agents.tests.fake_openai import FakeCall, FakeOpenAI, Reply

FIND_ORDER = ToolSpec(
    name="find_order",
    description="Look an order up by its number.",
    parameters={"type": "object", "properties": {"number": {"type": "string"}}, "required": ["number"]},
)
REFUND_STATUS = ToolSpec(
    name="refund_status",
    description="The customer's refund requests.",
    parameters={"type": "object", "properties": {"request_id": {"type": "integer"}}},
)
ASK = ModelRequest(
    system="You help customers of the shop.",
    messages=(ChatMessage("user", "I'd like a refund for order 1042"),),
    tools=(FIND_ORDER, REFUND_STATUS),
)
TWO_CALLS = (
    FakeCall("find_order", '{"number": "1042"}', id="call_a"),
    FakeCall("refund_status", '{"request_id": 7}', id="call_b"),
)


@pytest.fixture
def fake(settings: Any) -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        settings.AGENTS_OPENAI_BASE_URL = server.url
        settings.AGENTS_OPENAI_API_KEY = "sk-test"
        settings.AGENTS_OPENAI_MODEL = "fake-model"
        settings.AGENTS_OPENAI_TIMEOUT = 5
        yield server


def run(request: ModelRequest = ASK) -> list[ModelEvent]:
    return list(OpenAIProvider().stream(request))


def text_of(events: list[ModelEvent]) -> str:
    return "".join(event.text for event in events if isinstance(event, TextDelta))


def calls_of(events: list[ModelEvent]) -> list[ToolCall]:
    return [event for event in events if isinstance(event, ToolCall)]


def assert_one_finish_at_the_end(events: list[ModelEvent]) -> str:
    finishes = [event for event in events if isinstance(event, Finish)]
    assert len(finishes) == 1 and events[-1] is finishes[0]
    return finishes[0].reason


# -- what is sent


def test_a_round_is_one_streamed_post_with_the_system_prompt_the_conversation_and_the_tools(
    fake: FakeOpenAI,
) -> None:
    # given
    fake.script(Reply(text="Let me look."))

    # when
    events = run()

    # then
    (body,) = fake.requests
    assert body["model"] == "fake-model" and body["stream"] is True
    assert body["messages"] == [
        {"role": "system", "content": "You help customers of the shop."},
        {"role": "user", "content": "I'd like a refund for order 1042"},
    ]
    assert body["tools"][0] == {
        "type": "function",
        "function": {"name": "find_order", "description": FIND_ORDER.description, "parameters": FIND_ORDER.parameters},
    }
    assert "continue_final_message" not in body
    assert fake.headers[0]["authorization"] == "Bearer sk-test"
    assert text_of(events) == "Let me look."
    assert assert_one_finish_at_the_end(events) == "stop"


def test_calls_and_their_results_are_sent_back_in_openais_shape(fake: FakeOpenAI) -> None:
    # given
    fake.script(Reply(text="Done."))
    refused = ToolCall("call_2", "refund_status", None, error="the arguments are not valid JSON")
    request = ModelRequest(
        system="",
        messages=(
            ChatMessage("user", "refund 1042"),
            ChatMessage("assistant", tool_calls=(ToolCall("call_1", "find_order", {"number": "1042"}), refused)),
            ChatMessage("tool", '{"number": "1042"}', tool_call_id="call_1", name="find_order"),
            ChatMessage("tool", '{"error": "bad arguments"}', tool_call_id="call_2", name="refund_status"),
            ChatMessage("assistant", "Anything else?"),
        ),
        tools=(),
    )

    # when
    run(request)

    # then
    body = fake.requests[0]
    assert "tools" not in body
    assert body["messages"] == [  # no system message when there is no prompt
        {"role": "user", "content": "refund 1042"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "find_order", "arguments": '{"number": "1042"}'},
                },
                {"id": "call_2", "type": "function", "function": {"name": "refund_status", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"number": "1042"}'},
        {"role": "tool", "tool_call_id": "call_2", "content": '{"error": "bad arguments"}'},
        {"role": "assistant", "content": "Anything else?"},
    ]


def test_a_recovered_round_sends_the_delivered_text_and_asks_to_continue_it(fake: FakeOpenAI, settings: Any) -> None:
    # given
    fake.script(Reply(text="approval."), Reply(text="approval."))
    recovered = ModelRequest(system="", messages=ASK.messages, tools=(), prefix="It is awaiting ")

    # when
    events = run(recovered)
    settings.AGENTS_OPENAI_CONTINUE_FINAL_MESSAGE = False
    run(recovered)

    # then
    asked, plain = fake.requests
    assert asked["messages"][-1] == {"role": "assistant", "content": "It is awaiting "}
    assert asked["continue_final_message"] is True and asked["add_generation_prompt"] is False
    assert text_of(events) == "approval."  # the rest only
    assert plain["messages"][-1] == {"role": "assistant", "content": "It is awaiting "}
    assert "continue_final_message" not in plain and "add_generation_prompt" not in plain


def test_no_api_key_sends_no_authorization(fake: FakeOpenAI, settings: Any) -> None:
    # given
    settings.AGENTS_OPENAI_API_KEY = ""
    fake.script(Reply(text="Hi."))

    # when
    run()

    # then
    assert "authorization" not in fake.headers[0]


def test_a_provider_without_a_server_or_model_is_misconfigured(settings: Any) -> None:
    # given
    settings.AGENTS_OPENAI_BASE_URL = ""
    settings.AGENTS_OPENAI_MODEL = "fake-model"

    # then
    with pytest.raises(ImproperlyConfigured, match="AGENTS_OPENAI_BASE_URL"):
        run()


def test_get_provider_knows_the_two_models_and_refuses_others() -> None:
    assert get_provider("openai").name == "openai"
    assert get_provider("rules").name == "rules"
    with pytest.raises(ValueError, match="unknown model provider 'gpt'"):
        get_provider("gpt")


# -- what comes back


def test_text_is_yielded_as_it_arrives_not_when_the_stream_ends(fake: FakeOpenAI) -> None:
    # given a server that stops after its first word until the test lets it go on
    gate = threading.Event()
    fake.script(Reply(text="one two three", gate=gate))

    # when
    stream = OpenAIProvider().stream(ASK)
    first = next(stream)
    gate.set()
    rest = list(stream)

    # then
    assert first == TextDelta("one ")
    assert not fake.gate_timed_out  # the first word came while the server was still waiting
    assert text_of([first, *rest]) == "one two three"


def test_a_tool_call_is_yielded_whole_after_the_text(fake: FakeOpenAI) -> None:
    # given
    fake.script(Reply(text="Looking.", calls=(FakeCall("find_order", '{"number": "1042"}', id="call_x"),)))

    # when
    events = run()

    # then
    assert events == [
        TextDelta("Looking."),
        ToolCall("call_x", "find_order", {"number": "1042"}),
        Finish("tool_calls"),
    ]


QUIRKS = ("missing_index", "missing_id", "shared_index", "split_arguments")


@pytest.mark.parametrize(
    "quirks",
    [combination for n in range(len(QUIRKS) + 1) for combination in itertools.combinations(QUIRKS, n)],
    ids=lambda quirks: "+".join(quirks) or "plain",
)
def test_parallel_calls_are_put_together_whatever_the_quirks(fake: FakeOpenAI, quirks: tuple[str, ...]) -> None:
    # given
    fake.script(
        Reply(
            calls=TWO_CALLS,
            missing_index="missing_index" in quirks,
            missing_id="missing_id" in quirks,
            shared_index="shared_index" in quirks,
            split_arguments="split_arguments" in quirks,
        )
    )

    # when
    events = run()

    # then
    calls = calls_of(events)
    assert [(call.name, call.arguments, call.error) for call in calls] == [
        ("find_order", {"number": "1042"}, ""),
        ("refund_status", {"request_id": 7}, ""),
    ]
    if "missing_id" in quirks:
        assert all(call.id.startswith("call_") for call in calls) and calls[0].id != calls[1].id
    else:
        assert [call.id for call in calls] == ["call_a", "call_b"]
    assert assert_one_finish_at_the_end(events) == "tool_calls"


def test_made_up_ids_are_the_same_for_the_same_round_and_differ_for_another(fake: FakeOpenAI) -> None:
    # given
    reply = Reply(calls=(FakeCall("find_order", '{"number": "1042"}'),), missing_id=True)
    fake.script(reply, reply, reply, Reply(calls=(FakeCall("find_order", '{"number": "1043"}'),), missing_id=True))
    next_round = ModelRequest(
        system=ASK.system, messages=(*ASK.messages, ChatMessage("assistant", "Hm.")), tools=ASK.tools
    )

    # when
    first, again, later, other_arguments = run(), run(), run(next_round), run()

    # then
    assert calls_of(first) == calls_of(again)
    assert calls_of(first)[0].id != calls_of(later)[0].id
    assert calls_of(first)[0].id != calls_of(other_arguments)[0].id


def test_no_arguments_at_all_are_an_empty_object(fake: FakeOpenAI) -> None:
    # given
    fake.script(Reply(calls=(FakeCall("refund_status", "", id="call_s"),)))

    # then
    assert calls_of(run()) == [ToolCall("call_s", "refund_status", {})]


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        ('{"number": "10', "not valid JSON"),
        ("{'number': 1042}", "not valid JSON"),
        ('["1042"]', "not a JSON object but list"),
        ("1042", "not a JSON object but int"),
    ],
)
def test_malformed_arguments_become_a_refused_call_not_a_crash(fake: FakeOpenAI, arguments: str, why: str) -> None:
    # given
    fake.script(Reply(calls=(FakeCall("find_order", arguments, id="call_m"), TWO_CALLS[1]), split_arguments=True))

    # when
    events = run()

    # then
    refused, fine = calls_of(events)
    assert (refused.id, refused.name, refused.arguments) == ("call_m", "find_order", None)
    assert why in refused.error
    assert fine == ToolCall("call_b", "refund_status", {"request_id": 7})
    assert assert_one_finish_at_the_end(events) == "tool_calls"


def test_a_call_without_a_name_is_refused(fake: FakeOpenAI) -> None:
    # given
    nameless = {"index": 0, "id": "c1", "function": {"arguments": "{}"}}
    chunk = json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [nameless]}}]})
    fake.script(Reply(raw=(chunk, '{"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}')))

    # then
    assert calls_of(run()) == [ToolCall("c1", "", None, error="the model called a tool without naming it")]


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (Reply(text="Cut", finish_reason="length"), "length"),
        (Reply(text="No.", finish_reason="content_filter"), "content_filter"),
        (Reply(calls=TWO_CALLS[:1], finish_reason="stop"), "tool_calls"),  # some servers say stop after calls
        (Reply(text="Hi.", finish_reason="eos"), "stop"),
        (Reply(text="Hi.", send_finish=False), "stop"),  # [DONE] alone ends it
        (Reply(text="Hi.", send_done=False), "stop"),  # a finish_reason alone ends it
    ],
)
def test_the_finish_reason_is_openais(fake: FakeOpenAI, reply: Reply, reason: str) -> None:
    # given
    fake.script(reply)

    # then
    assert assert_one_finish_at_the_end(run()) == reason


# -- failures the caller may retry


def test_dying_mid_stream_is_a_provider_error_after_the_text_already_sent(fake: FakeOpenAI) -> None:
    # given a server that closes the socket after the role chunk and two words
    fake.script(Reply(text="one two three four", die_after=3))

    # when
    received: list[ModelEvent] = []
    with pytest.raises(ProviderError, match="RemoteProtocolError"):
        for event in OpenAIProvider().stream(ASK):
            received.append(event)

    # then
    assert received == [TextDelta("one "), TextDelta("two ")]


def test_dying_while_calls_arrive_yields_no_half_call(fake: FakeOpenAI) -> None:
    # given
    fake.script(Reply(calls=TWO_CALLS, split_arguments=True, die_after=8))

    # when
    received: list[ModelEvent] = []
    with pytest.raises(ProviderError):
        for event in OpenAIProvider().stream(ASK):
            received.append(event)

    # then
    assert received == []


def test_a_stream_that_ends_before_the_model_finished_is_a_provider_error(fake: FakeOpenAI) -> None:
    # given
    fake.script(Reply(text="one two", send_finish=False, send_done=False))

    # then
    with pytest.raises(ProviderError, match="ended before it finished"):
        run()


def test_an_http_error_is_a_provider_error(fake: FakeOpenAI) -> None:
    # given
    fake.script(Reply(status=500))

    # then
    with pytest.raises(ProviderError, match="HTTP 500: .*scripted status 500"):
        run()


def test_a_slow_server_is_waited_for_up_to_the_timeout(fake: FakeOpenAI, settings: Any) -> None:
    # given
    settings.AGENTS_OPENAI_TIMEOUT = 0.5
    fake.script(Reply(text="slow but steady", delay=0.1), Reply(text="too slow", delay=1.5))

    # then
    assert text_of(run()) == "slow but steady"
    with pytest.raises(ProviderError, match="ReadTimeout"):
        run()


def test_a_server_that_is_not_there_is_a_provider_error(settings: Any) -> None:
    # given a port nobody listens on
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    settings.AGENTS_OPENAI_BASE_URL = f"http://127.0.0.1:{port}/v1"
    settings.AGENTS_OPENAI_MODEL = "fake-model"

    # then
    with pytest.raises(ProviderError, match="ConnectError"):
        run()


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        ("{not json", "not JSON"),
        ('["a list"]', "not an object"),
        ('{"error": {"message": "model overloaded"}}', "model overloaded"),
    ],
)
def test_a_broken_or_error_chunk_is_a_provider_error(fake: FakeOpenAI, payload: str, why: str) -> None:
    # given
    fake.script(Reply(raw=(payload, "[DONE]")))

    # then
    with pytest.raises(ProviderError, match=why):
        run()


def test_usage_chunks_are_skipped(fake: FakeOpenAI) -> None:
    # given
    fake.script(
        Reply(
            raw=(
                '{"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": null}]}',
                '{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}',
                '{"choices": [{"index": 0, "delta": {"content": "."}, "finish_reason": "stop"}]}',
                "[DONE]",
            )
        )
    )

    # then
    assert run() == [TextDelta("Hi"), TextDelta("."), Finish("stop")]


def test_comments_other_fields_and_blank_lines_are_not_data() -> None:
    # given
    lines = [
        ": keep-alive",
        "",
        "event: message",
        'data:{"choices": [{"delta": {"content": "Hi"}}]}',  # no space after the colon, no index
        "",
        'data: {"choices": [{"index": null, "delta": {"content": "!"}}]}',
        'data: {"choices": [{"index": 1, "delta": {"content": "another choice"}}]}',
        "data: [DONE]",
    ]

    # then
    assert list(stream_events(lines, seed="1")) == [TextDelta("Hi"), TextDelta("!"), Finish("stop")]
