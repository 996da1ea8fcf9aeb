"""A turn's stream over Server-Sent Events, from a real daphne: the AI SDK's shape, ``id: <seq>``,
``Last-Event-ID``, a live turn followed to ``[DONE]`` with no gap and no duplicate; tenancy."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token

from agents.models import Agent, Chunk, Turn, TurnStatus
from agents.tests.test_consumers import KIND, World, make_turn, write
from agents.tests.test_consumers import world as world  # noqa: F401  the fixture
from tests.support import AsgiServer, thread_of
from workflows.tests.test_consumers import TIMEOUT, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

Event = tuple[int | None, Any]  # (id, data)


def stream(
    server: AsgiServer,
    user: User | None,
    turn: Turn,
    *,
    last_event_id: str | None = None,
    query: str = "",
    name: str = "help",
) -> tuple[httpx.Response, list[Event]]:
    """GET the stream and read it to its end: the response and its events (``[DONE]`` as a string)."""
    headers = {"Cookie": session_cookie(user)} if user is not None else {}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    url = f"{server.url}/api/agents/{KIND}/{name}/turns/{turn.pk}/stream{query}"
    events: list[Event] = []
    with httpx.stream("GET", url, headers=headers, timeout=TIMEOUT) as response:
        if response.status_code != 200:
            response.read()
            return response, events
        seq: int | None = None
        for line in response.iter_lines():
            if line.startswith("id: "):
                seq = int(line[4:])
            elif line.startswith("data: "):
                text = line[6:]
                events.append((seq, text if text == "[DONE]" else json.loads(text)))
            elif line == "":
                seq = None
    return response, events


def finished_turn(world: World) -> Turn:
    turn = make_turn(world.agent, status=TurnStatus.COMPLETED)
    rows = [
        ("start", {}),
        ("text-delta", {"delta": "Let me "}),
        ("text-delta", {"delta": "look."}),
        ("tool-input-available", {"toolCallId": "c1", "toolName": "find_order", "input": {"number": "1042"}}),
        ("tool-output-available", {"toolCallId": "c1", "output": {"status": "delivered"}}),
        ("data-notice", {"text": "Waiting for approval"}),
        ("text-delta", {"delta": "Done."}),
        ("finish", {"reason": "stop"}),
    ]
    for seq, (type_, data) in enumerate(rows, start=1):
        Chunk.objects.create(turn=turn, seq=seq, type=type_, data=data)
    return turn


def test_a_finished_turn_streams_in_the_ai_sdk_shape_then_done(asgi_server: AsgiServer, world: World) -> None:
    turn = finished_turn(world)

    response, events = stream(asgi_server, world.users.alice, turn)

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert events == [
        (1, {"type": "start", "messageId": str(turn.pk)}),
        (None, {"type": "text-start", "id": "text"}),
        (2, {"type": "text-delta", "id": "text", "delta": "Let me "}),
        (3, {"type": "text-delta", "id": "text", "delta": "look."}),
        (None, {"type": "text-end", "id": "text"}),
        (
            4,
            {"type": "tool-input-available", "toolCallId": "c1", "toolName": "find_order", "input": {"number": "1042"}},
        ),
        (5, {"type": "tool-output-available", "toolCallId": "c1", "output": {"status": "delivered"}}),
        (6, {"type": "data-notice", "data": {"text": "Waiting for approval"}}),
        (None, {"type": "text-start", "id": "text"}),
        (7, {"type": "text-delta", "id": "text", "delta": "Done."}),
        (None, {"type": "text-end", "id": "text"}),
        (8, {"type": "finish", "messageMetadata": {"reason": "stop"}}),
        (None, "[DONE]"),
    ]


def test_last_event_id_resumes_after_that_seq(asgi_server: AsgiServer, world: World) -> None:
    turn = finished_turn(world)

    _, events = stream(asgi_server, world.users.alice, turn, last_event_id="2")
    _, after_the_end = stream(asgi_server, world.users.alice, turn, last_event_id="8")

    assert [seq for seq, _ in events] == [None, 3, None, 4, 5, 6, None, 7, None, 8, None]
    assert events[0] == (None, {"type": "text-start", "id": "text"})  # the resumed text part opens again
    assert after_the_end == [(None, "[DONE]")]


def test_a_live_turn_is_followed_to_its_finish_with_no_gap_and_no_duplicate(
    asgi_server: AsgiServer, world: World
) -> None:
    # given a running turn with two chunks
    turn = make_turn(world.agent)
    write(turn, [1, 2])
    result: list[list[Event]] = []
    reader = thread_of(lambda: result.append(stream(asgi_server, world.users.bob, turn)[1]))
    reader.start()

    # when the writer goes on, one push lost, then finishes and the turn completes
    time.sleep(0.5)
    write(turn, [3, 4])
    write(turn, [5], push=False)
    write(turn, [6])
    Chunk.objects.create(turn=turn, seq=7, type="finish", data={"reason": "stop"})
    Turn.objects.filter(pk=turn.pk).update(status=TurnStatus.COMPLETED)
    reader.join(TIMEOUT)

    # then the reader got every seq once, in order, and the end
    [events] = result
    assert [seq for seq, _ in events if seq is not None] == [1, 2, 3, 4, 5, 6, 7]
    assert events[-1] == (None, "[DONE]")


def test_a_turn_that_ended_without_a_finish_chunk_still_ends_the_stream(asgi_server: AsgiServer, world: World) -> None:
    turn = make_turn(world.agent, status=TurnStatus.FAILED)
    Chunk.objects.create(turn=turn, seq=1, type="text-delta", data={"delta": "par"})

    _, events = stream(asgi_server, world.users.alice, turn)

    assert events == [
        (None, {"type": "text-start", "id": "text"}),
        (1, {"type": "text-delta", "id": "text", "delta": "par"}),
        (None, {"type": "text-end", "id": "text"}),
        (None, "[DONE]"),
    ]


def test_a_purged_stream_gives_the_turns_answer_whole(asgi_server: AsgiServer, world: World) -> None:
    # a turn answered long ago, its stream purged: its text and status stay
    turn = finished_turn(world)
    Turn.objects.filter(pk=turn.pk).update(text="Let me look.Done.")
    Chunk.objects.filter(turn=turn).delete()
    never_ran = make_turn(world.agent, number=2, status=TurnStatus.CANCELLED)

    _, events = stream(asgi_server, world.users.alice, turn)
    _, resumed = stream(asgi_server, world.users.alice, turn, last_event_id="8")
    _, nothing = stream(asgi_server, world.users.alice, never_ran)

    # from the start: the answer in one text part, without ids, then its finish
    assert events == [
        (None, {"type": "start", "messageId": str(turn.pk)}),
        (None, {"type": "text-start", "id": "text"}),
        (None, {"type": "text-delta", "id": "text", "delta": "Let me look.Done."}),
        (None, {"type": "text-end", "id": "text"}),
        (None, {"type": "finish", "messageMetadata": {"reason": "stop"}}),
        (None, "[DONE]"),
    ]
    # a client that had the stream up to its end gets nothing again; a turn that never ran, its end
    assert resumed == nothing == [(None, "[DONE]")]


def test_refusals_are_the_apis_json_errors(asgi_server: AsgiServer, world: World) -> None:
    turn = finished_turn(world)

    refused = {
        "anonymous": stream(asgi_server, None, turn)[0],
        "mallory": stream(asgi_server, world.users.mallory, turn, query="?account=acme")[0],
        "mallory's own agent": stream(asgi_server, world.users.mallory, turn)[0],
        "another agent": stream(asgi_server, world.users.alice, turn, name="other")[0],
        "bad Last-Event-ID": stream(asgi_server, world.users.alice, turn, last_event_id="x")[0],
        "account twice": stream(asgi_server, world.users.alice, turn, query="?account=globex&account=acme")[0],
        "unknown parameter": stream(asgi_server, world.users.alice, turn, query="?acount=acme")[0],
        "bad account": stream(asgi_server, world.users.alice, turn, query="?account=a%20b")[0],
    }

    assert {who: r.status_code for who, r in refused.items()} == {
        "anonymous": 401,
        "mallory": 404,
        "mallory's own agent": 404,
        "another agent": 404,
        "bad Last-Event-ID": 400,
        "account twice": 400,
        "unknown parameter": 400,
        "bad account": 400,
    }
    assert refused["mallory"].json() == {"error": {"code": "not_found", "message": "Not found.", "detail": None}}
    # the query is read as the turn's API reads it: named, once
    assert refused["account twice"].json()["error"]["detail"] == {"account": ["Given more than once; give it once."]}
    assert refused["unknown parameter"].json()["error"]["detail"] == {"acount": ["Unknown field."]}
    assert stream(asgi_server, world.users.alice, turn, query="?account=acme")[0].status_code == 200
    # and following a stream never creates its agent (a link any site can put in front of alice)
    assert not Agent.objects.filter(name="other").exists()


def test_a_token_is_accepted_like_the_rest_of_the_api(asgi_server: AsgiServer, world: World) -> None:
    turn = finished_turn(world)
    token, _ = Token.objects.get_or_create(user=world.users.alice)
    url = f"{asgi_server.url}/api/agents/{KIND}/help/turns/{turn.pk}/stream"

    good = httpx.get(url, headers={"Authorization": f"Token {token.key}"}, timeout=TIMEOUT)
    bad = httpx.get(url, headers={"Authorization": "Token nope"}, timeout=TIMEOUT)

    assert good.status_code == 200 and good.text.endswith("data: [DONE]\n\n")
    assert bad.status_code == 401

    # and the caller is found as the rest of the API finds them: the token first, read from the
    # header split at ASCII whitespace, the keyword in any case, the key as UTF-8, any key a token
    # can have (one staff typed in the admin); then the session
    typed = Token.objects.create(user=world.users.bob, key="bobs-clé_typed.in.the.admin")
    key = token.key.encode()
    cookie = session_cookie(world.users.alice)
    cases: dict[str, tuple[dict[str, Any], int]] = {
        "lower-case keyword": ({"Authorization": b"token " + key}, 200),
        "two spaces": ({"Authorization": b"TOKEN  " + key}, 200),
        "a typed key, in UTF-8": ({"Authorization": b"Token " + typed.key.encode()}, 200),
        "more after the key": ({"Authorization": b"Token " + key + b" more"}, 401),
        "no-break space": ({"Authorization": b"Token\xa0" + key}, 401),
        "unit separator": ({"Authorization": b"Token\x1f" + key}, 401),
        "Basic, with a session": ({"Authorization": b"Basic YWxpY2U6eA==", "Cookie": cookie}, 200),
        "a bad token, with a session": ({"Authorization": b"Token nope", "Cookie": cookie}, 401),
        "the keyword alone": ({"Authorization": b"Token"}, 401),
    }
    answers = {
        what: [
            httpx.get(where, headers=headers, timeout=TIMEOUT).status_code
            for where in (url, f"{asgi_server.url}/api/agents/{KIND}/help")
        ]
        for what, (headers, _) in cases.items()
    }
    assert answers == {what: [expected, expected] for what, (_, expected) in cases.items()}

    # and a POST, by token or by a signed-in browser without a CSRF token, is the API's JSON 405
    for headers in ({"Authorization": f"Token {token.key}"}, {"Cookie": session_cookie(world.users.alice)}):
        posted = httpx.post(url, headers=headers, timeout=TIMEOUT)
        assert posted.status_code == 405 and posted.json()["error"]["code"] == "method_not_allowed", posted.text


@pytest.fixture
def small_pool_server() -> Any:
    """A daphne of its own whose pool has 4 connections and gives up waiting for one after 5 s."""
    server = AsgiServer(DATABASE_POOL_MAX_SIZE="4", DATABASE_POOL_MIN_SIZE="1", DATABASE_POOL_TIMEOUT="5")
    yield server
    server.stop()


def test_open_streams_hold_no_database_connection(small_pool_server: AsgiServer, world: World) -> None:
    # given a server whose pool has 4 connections
    server = small_pool_server
    done = finished_turn(world)

    # when 12 streams of a finished turn are opened at once (three times the pool)
    results: list[list[Event]] = []
    barrier = threading.Barrier(12)

    def read_done() -> None:
        barrier.wait()
        results.append(stream(server, world.users.alice, done)[1])

    readers = [thread_of(read_done) for _ in range(12)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(TIMEOUT)

    # then each is read to its end
    assert len(results) == 12 and all(events and events[-1] == (None, "[DONE]") for events in results)

    # and when 8 streams follow a live turn, waiting for its next chunk
    live = make_turn(world.agent, number=2)
    write(live, [1])

    followers = [thread_of(lambda: stream(server, world.users.bob, live)) for _ in range(8)]
    for follower in followers:
        follower.start()
    time.sleep(2)  # every stream has read and is waiting

    # then a request that needs the database is answered at once: no stream holds a connection
    started = time.monotonic()
    answer = httpx.get(f"{server.url}/api/runs", headers={"Authorization": "Token " + "0" * 40}, timeout=30)
    assert answer.status_code == 401 and time.monotonic() - started < 3

    # and the turn's end ends them all
    Chunk.objects.create(turn=live, seq=2, type="finish", data={"reason": "stop"})
    Turn.objects.filter(pk=live.pk).update(status=TurnStatus.COMPLETED)
    for follower in followers:
        follower.join(TIMEOUT)
    assert not any(follower.is_alive() for follower in followers)
