"""Which agent a person reaches, read directly: bounded creation and names no path can forge."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import pytest

from accounts.services import account_ensure
from agents import selectors
from agents.models import Agent, Chunk, Message, MessageRole, Turn, TurnStatus
from agents.selectors import FAILED_REASON, SNAPSHOT_BYTES, AgentSnapshot, agent_get, agent_snapshot, turn_data
from tests.factories import Users, api_login, login
from tests.support import race

pytestmark = pytest.mark.django_db


def test_opening_new_names_stops_at_the_accounts_limit_and_says_so_to_members_only(settings: Any, users: Users) -> None:
    # given an account allowed three agents, with three already opened
    settings.AGENTS_MAX_AGENTS_PER_ACCOUNT = 3
    account_ensure(slug="acme", members=[users.alice, users.bob])
    opened = [agent_get(user=users.alice, kind="test.chat", name=f"a{i}") for i in range(3)]

    # then a fourth name is refused, saying why, and the three stay reachable, for bob too
    with pytest.raises(selectors.TooManyAgents, match="'acme' has 3 agents, its limit"):
        agent_get(user=users.alice, kind="test.chat", name="a3")
    assert [agent_get(user=users.bob, kind="test.chat", name=f"a{i}") for i in range(3)] == opened
    # and someone outside the account is told nothing about it
    assert agent_get(user=users.carol, kind="test.chat", name="a3", account="acme") is None
    assert Agent.objects.count() == 3

    # and a member opening the fourth, on the chat page or through the API, reads why, not "No such agent"
    page = login(users.alice).post("/chat/test.chat/a3/")  # the chat page's "Start it"
    assert page.status_code == 409 and "has 3 agents, its limit" in page.content.decode()
    answer = api_login(users.alice).post(
        "/api/agents/test.chat/a3/submissions", {"messages": [{"content": "hi"}]}, format="json"
    )
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "too_many_agents"
    assert "has 3 agents, its limit" in answer.json()["error"]["message"]
    assert login(users.carol).post("/chat/test.chat/a3/?account=acme").status_code == 404
    assert Agent.objects.count() == 3


def test_a_name_decoded_from_bytes_that_are_not_utf8_names_no_agent(users: Users) -> None:
    account_ensure(slug="acme", members=[users.alice])

    assert agent_get(user=users.alice, kind="test.chat", name="\ufffd\ufffd\ufffd") is None
    assert agent_get(user=users.alice, kind="test.chat", name="caf\ufffd") is None
    assert agent_get(user=users.alice, kind="test.chat", name="café") is not None


@pytest.mark.parametrize("name", [".", ".."])
def test_a_dot_segment_names_no_agent_since_no_browser_could_open_it_again(users: Users, name: str) -> None:
    account_ensure(slug="acme", members=[users.alice])
    assert agent_get(user=users.alice, kind="test.chat", name=name) is None
    assert not selectors.reachable_name(name)
    assert not Agent.objects.exists()
    assert agent_get(user=users.alice, kind="test.chat", name="...") is not None  # only those two
    assert not Agent.objects.filter(name__contains="\ufffd").exists()


@pytest.mark.parametrize(
    "name",
    [
        "\u202egpj.exe", "\u200binvisible", " lead", "lead ", "a\u2028b", "tab\there",
        "help\u3164", "\u3164", "\u2800", "he\u034flp",  # drawn as nothing, though not format characters
        "he\u200dlp", "\u200d\U0001f469", "\U0001f469\u200d", "\U0001f469\u200d \U0001f4bb",  # a joiner joining nothing
    ],
)  # fmt: skip
def test_a_name_that_would_read_otherwise_names_no_agent_on_any_path(users: Users, name: str) -> None:
    # given names the chat form refuses: written otherwise than they read ("exe.jpg"), or not at all
    account_ensure(slug="acme", members=[users.alice])
    path = quote(name, safe="")

    # then no path creates or opens such an agent: the selector, the chat page, the API's messages,
    # its submissions and its reads answer as for a name no agent can have
    assert agent_get(user=users.alice, kind="test.chat", name=name) is None
    assert not selectors.reachable_name(name)
    assert login(users.alice).post(f"/chat/test.chat/{path}/").status_code == 404
    client = api_login(users.alice)
    assert client.post(f"/api/agents/test.chat/{path}/messages", {"text": "hi"}, format="json").status_code == 404
    answer = client.post(f"/api/agents/test.chat/{path}/submissions", {"messages": [{"content": "hi"}]}, format="json")
    assert answer.status_code == 404
    assert client.get(f"/api/agents/test.chat/{path}").status_code == 404
    assert not Agent.objects.exists()
    assert agent_get(user=users.alice, kind="test.chat", name="my agent") is not None  # a space inside is a name


@pytest.mark.parametrize(
    "name",
    [
        "\U0001f468\u200d\U0001f469\u200d\U0001f467",  # a family: three emoji joined
        "\U0001f469\u200d\U0001f4bb dev",
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # Persian, with its zero-width non-joiner
        "caf\u00e9",
        "\U0001f389 party",
    ],
)  # fmt: skip
def test_joined_emoji_and_scripts_that_need_a_joiner_name_an_agent(users: Users, name: str) -> None:
    account_ensure(slug="acme", members=[users.alice])
    assert selectors.reachable_name(name)
    assert agent_get(user=users.alice, kind="test.chat", name=name) is not None


def test_members_read_that_a_turn_failed_not_the_error_behind_it(users: Users) -> None:
    # given a turn that failed on an internal error, and one sealed for a reason meant for them
    account_ensure(slug="acme", members=[users.alice])
    agent = agent_get(user=users.alice, kind="test.chat", name="help")
    assert agent is not None
    failed = Turn.objects.create(
        agent=agent, number=1, status=TurnStatus.FAILED, end_reason="ResultTooLarge: 1,050,617 bytes"
    )
    sealed = Turn.objects.create(agent=agent, number=2, status=TurnStatus.SEALED, end_reason="too many rounds")

    # then members read that it failed, staff keep the error on the row, and other reasons are shown
    assert turn_data(failed)["end_reason"] == FAILED_REASON
    assert failed.end_reason.startswith("ResultTooLarge")
    assert turn_data(sealed)["end_reason"] == "too many rounds"


def test_a_snapshot_of_a_long_conversation_in_cyrillic_still_fits_one_message(users: Users) -> None:
    # given a hundred long messages whose every character escapes to six bytes of JSON
    account_ensure(slug="acme", members=[users.alice])
    agent = agent_get(user=users.alice, kind="test.chat", name="help")
    assert agent is not None
    turns = Turn.objects.bulk_create(Turn(agent=agent, number=i + 1, status=TurnStatus.COMPLETED) for i in range(100))
    Message.objects.bulk_create(
        Message(agent=agent, turn=t, role=MessageRole.USER, text=f"{i} " + "ж" * 4000) for i, t in enumerate(turns)
    )

    # when a client is sent its snapshot
    snapshot = agent_snapshot(agent=agent)

    # then it fits well inside the 1 MiB a channel-layer message may carry, and ends with the newest
    assert len(json.dumps(snapshot)) <= SNAPSHOT_BYTES + 10_000
    assert snapshot["messages"][-1]["text"].startswith("99 ")
    assert 0 < len(snapshot["messages"]) < 100


def test_a_snapshot_since_a_message_holds_only_the_later_ones_and_says_when_it_left_some_out(
    users: Users, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a conversation of five messages, and room for three in a snapshot
    account_ensure(slug="acme", members=[users.alice])
    agent = agent_get(user=users.alice, kind="test.chat", name="help")
    assert agent is not None
    sent = [Message.objects.create(agent=agent, role=MessageRole.USER, text=f"m{i}") for i in range(5)]
    monkeypatch.setattr(selectors, "SNAPSHOT_MESSAGES", 3)

    # when snapshots are read whole, and since the second, the first and the last message
    whole = agent_snapshot(agent=agent)
    after_second = agent_snapshot(agent=agent, since=sent[1].pk)
    after_first = agent_snapshot(agent=agent, since=sent[0].pk)
    after_last = agent_snapshot(agent=agent, since=sent[4].pk)

    def texts(snapshot: AgentSnapshot) -> list[str]:
        return [m["text"] for m in snapshot["messages"]]

    # then the whole one is the newest three and says older ones were left out
    assert (texts(whole), whole["since"], whole["more"]) == (["m2", "m3", "m4"], None, True)
    # and since a message: the ones after it, all of them when they fit
    assert (texts(after_second), after_second["since"], after_second["more"]) == (["m2", "m3", "m4"], sent[1].pk, False)
    assert (texts(after_first), after_first["more"]) == (["m2", "m3", "m4"], True)  # m1 left out
    assert (texts(after_last), after_last["more"]) == ([], False)


def streamed_turn(users: Users, stream: Sequence[tuple[str, object]]) -> Turn:
    """A running turn of alice's agent with ``stream`` stored as its chunks, in order."""
    account_ensure(slug="acme", members=[users.alice])
    agent = agent_get(user=users.alice, kind="test.chat", name="help")
    assert agent is not None
    turn = Turn.objects.create(agent=agent, number=1, status=TurnStatus.RUNNING)
    Chunk.objects.bulk_create(Chunk(turn=turn, seq=i + 1, type=t, data=d) for i, (t, d) in enumerate(stream))
    return turn


def test_a_turns_partial_text_is_what_its_stream_showed(users: Users) -> None:
    # given a stream: a round's text, a tool call, a round that was reset and streamed again
    stream = [
        ("start", {}),
        ("text-delta", {"delta": "Let me "}),
        ("text-delta", {"delta": "look. "}),
        ("tool-input-available", {"toolName": "order_get"}),
        ("tool-output-available", {"output": {}}),
        ("text-delta", {"delta": "It was "}),
        ("data-reset", {}),
        ("text-delta", {"delta": "It is "}),
        ("text-delta", {"delta": "on its way"}),
    ]
    turn = streamed_turn(users, stream)

    assert selectors.turn_partial_text(turn_id=turn.pk) == "Let me look.\n\nIt is on its way"
    assert selectors.turn_partial_text(turn_id=Turn.objects.create(agent=turn.agent, number=2).pk) == ""


def test_a_round_reset_after_its_tool_call_is_not_shown_twice(users: Users) -> None:
    # given a round that wrote text and called a tool, then was recovered ("retry"): it writes its
    # text again, and its tool call, sent once already, is not sent again
    stream = [
        ("text-delta", {"delta": "Let me check."}),
        ("tool-input-available", {"toolName": "find_order", "toolCallId": "c1"}),
        ("data-reset", {}),
        ("text-delta", {"delta": "Let me check."}),
        ("tool-output-available", {"toolCallId": "c1", "output": {}}),
        ("text-delta", {"delta": "It is on its way."}),
    ]
    turn = streamed_turn(users, stream)

    assert selectors.turn_partial_text(turn_id=turn.pk) == "Let me check.\n\nIt is on its way."


def test_a_stopped_turns_messages_keep_its_answered_tool_calls(users: Users) -> None:
    # given a stream: text, two calls of which one has its result stored, the next round's text
    stream = [
        ("start", {}),
        ("text-delta", {"delta": "Let me look. "}),
        ("tool-input-available", {"toolCallId": "a", "toolName": "find_order", "input": {"order": "1042"}}),
        ("tool-input-available", {"toolCallId": "b", "toolName": "request_refund", "input": {"order": "1042"}}),
        ("tool-output-available", {"toolCallId": "a", "output": {"amount": "150.00"}}),
        ("text-delta", {"delta": "It cost "}),
    ]
    turn = streamed_turn(users, stream)

    added = selectors.turn_stopped_messages(turn_id=turn.pk)

    # then the answered call and its result stay, the unanswered one does not, and the last text follows
    assert added == [
        {
            "role": "assistant",
            "content": "Let me look. ",
            "tool_calls": [{"id": "a", "name": "find_order", "arguments": {"order": "1042"}}],
        },
        {"role": "tool", "tool_call_id": "a", "name": "find_order", "content": {"amount": "150.00"}},
        {"role": "assistant", "content": "It cost", "tool_calls": []},
    ]


@pytest.mark.django_db(transaction=True)
def test_members_opening_new_names_at_once_never_pass_the_accounts_limit(
    settings: Any, users: Users, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given an account allowed two agents, with one, and creating an agent slowed down (the window
    # between counting the account's agents and adding one, held open)
    settings.AGENTS_MAX_AGENTS_PER_ACCOUNT = 2
    account_ensure(slug="acme", members=[users.alice, users.bob])
    agent_get(user=users.alice, kind="test.chat", name="first")
    create = Agent.objects.create

    def slow_create(**fields: Any) -> Agent:
        time.sleep(0.3)
        return create(**fields)

    monkeypatch.setattr(Agent.objects, "create", slow_create)
    names, lock = iter(["n0", "n1", "n2"]), threading.Lock()

    def open_a_new_name() -> Agent | None:
        with lock:
            name = next(names)
        return agent_get(user=users.alice, kind="test.chat", name=name)

    # when three new names are opened at once
    results = race(open_a_new_name, n=3)

    # then one is created and two are refused: the account has its two, not four
    assert sorted(type(result).__name__ for result in results) == ["Agent", "TooManyAgents", "TooManyAgents"]
    assert Agent.objects.filter(account__slug="acme").count() == 2
