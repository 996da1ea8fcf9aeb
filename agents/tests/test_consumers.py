"""``/ws/agents/<kind>/<name>/`` against a real daphne process.

The writer of a turn's stream is simulated here: chunks are inserted in the database and their push
(``agents.streams.push_later``) sent after the commit, as the turn's model step does; a push left
out is a push the channel layer lost. Every test commits its rows (``transaction=True``) so the
server process sees them; sessions travel as a Cookie header with the page's own Origin.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import pytest
from asgiref.sync import async_to_sync
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from accounts.models import Account
from accounts.services import account_ensure
from agents import selectors
from agents.consumers import REPLAY_PAGE, max_frame_chars, max_text_chars
from agents.models import Agent, Chunk, Message, Turn, TurnStatus
from agents.streams import chunk_data, chunks_message, push_later
from config.routing import websocket_urlpatterns
from tests.factories import Users, login, session_of
from tests.support import AsgiServer, thread_of, wait_for, websocket
from workflows.consumers import CLOSE_NOT_FOUND, CLOSE_UNAUTHENTICATED
from workflows.streams import publisher
from workflows.tests.test_consumers import TIMEOUT, receive, receive_until, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

KIND = "support"
Frame = dict[str, Any]


# --- the world: alice and bob share an account, mallory has her own ----------------------------------
@dataclass(frozen=True)
class World:
    users: Users
    acme: Account
    other: Account
    agent: Agent  # acme's support agent "help"


@pytest.fixture
def world(users: Users) -> World:
    acme = account_ensure(slug="acme", name="Acme", members=[users.alice, users.bob])
    other = account_ensure(slug="other", name="Other", members=[users.mallory])
    agent = Agent.objects.create(account=acme, kind=KIND, name="help")
    return World(users=users, acme=acme, other=other, agent=agent)


def open_chat(
    server: AsgiServer, user: User | None, *, kind: str = KIND, name: str = "help", query: str = ""
) -> ClientConnection:
    cookie = session_cookie(user) if user is not None else None
    url = f"{server.ws_url}/ws/agents/{kind}/{name}/{query}"
    return websocket(url, origin=server.url, cookie=cookie, timeout=TIMEOUT)


def refusal(server: AsgiServer, user: User | None, **where: str) -> tuple[int | None, list[str]]:
    """Connect and read until the server closes: (close code, anything it sent first)."""
    sent: list[str] = []
    with open_chat(server, user, **where) as ws:
        try:
            while True:
                sent.append(str(ws.recv(timeout=TIMEOUT)))
        except ConnectionClosed as closed:
            assert closed.rcvd is not None
            return closed.rcvd.code, sent


def make_turn(agent: Agent, *, number: int = 1, status: str = TurnStatus.RUNNING) -> Turn:
    # The status is a protected FSM field: set once at creation, as a fixture of any state.
    return Turn.objects.create(agent=agent, number=number, status=status)


def write(turn: Turn, seqs: Iterable[int], *, push: bool = True) -> None:
    """What the turn's model step does with a batch: one transaction storing the chunks, and their
    push after the commit. ``push=False``: the push is lost."""
    with transaction.atomic():
        chunks = [
            Chunk.objects.create(turn=turn, seq=seq, type="text-delta", data={"delta": f"w{seq} "}) for seq in seqs
        ]
        if push:
            push_later(turn.agent_id, chunks_message(turn, [chunk_data(c.seq, c.type, c.data) for c in chunks]))
    assert publisher.flush(TIMEOUT)


def chunk_seqs(frames: list[Frame]) -> list[int]:
    return [f["seq"] for f in frames if f["type"] == "chunk"]


def is_replay_complete(frame: Frame) -> bool:
    return bool(frame["type"] == "replay_complete")


def as_json(value: Any) -> Any:
    return json.loads(json.dumps(value))


def stored_counts() -> tuple[int, int, int, int]:
    return Agent.objects.count(), Turn.objects.count(), Message.objects.count(), Chunk.objects.count()


# --- refusals and tenancy ---------------------------------------------------------------------------
def test_unauthenticated_socket_is_closed_with_4401_and_sent_nothing(asgi_server: AsgiServer, world: World) -> None:
    assert refusal(asgi_server, None) == (CLOSE_UNAUTHENTICATED, [])


def test_another_accounts_agent_is_refused_like_an_unknown_one(asgi_server: AsgiServer, world: World) -> None:
    mallory = world.users.mallory

    # mallory naming alice's account, an account that does not exist, and a kind nobody registered
    assert refusal(asgi_server, mallory, query="?account=acme") == (CLOSE_NOT_FOUND, [])
    assert refusal(asgi_server, mallory, query="?account=nope") == (CLOSE_NOT_FOUND, [])
    assert refusal(asgi_server, mallory, kind="nope") == (CLOSE_NOT_FOUND, [])
    assert refusal(asgi_server, world.users.alice, kind="nope") == (CLOSE_NOT_FOUND, [])
    assert refusal(asgi_server, world.users.alice, query="?account=%00") == (CLOSE_NOT_FOUND, [])
    assert refusal(asgi_server, world.users.alice, name="x" * 129) == (CLOSE_NOT_FOUND, [])
    # an account named twice is neither: which was meant? (her own, first or last, all the same)
    for query in ("?account=globex&account=acme", "?account=acme&account=globex", "?account=acme&account=acme"):
        assert refusal(asgi_server, world.users.alice, query=query) == (CLOSE_NOT_FOUND, []), query
    # and no agent was created for any of them
    assert list(Agent.objects.values_list("account__slug", "kind", "name")) == [("acme", KIND, "help")]

    # and a socket opens no agent of mallory's own either (only the chat page's button does)
    assert refusal(asgi_server, mallory) == (CLOSE_NOT_FOUND, [])
    assert not Agent.objects.filter(account=world.other).exists()

    # without ?account= mallory reaches her own account's agent of that name, a different one
    Agent.objects.create(account=world.other, kind=KIND, name="help")
    with open_chat(asgi_server, mallory) as ws:
        snapshot = receive(ws)
    assert snapshot["agent"] == {"kind": KIND, "name": "help", "account": "other"}


def test_bob_sees_the_agent_of_the_account_he_shares_with_alice(asgi_server: AsgiServer, world: World) -> None:
    Message.objects.create(agent=world.agent, role="user", text="hello", author=world.users.alice)

    with open_chat(asgi_server, world.users.bob, query="?account=acme") as ws:
        bobs = receive(ws)
    with open_chat(asgi_server, world.users.alice) as ws:
        alices = receive(ws)

    assert bobs == alices
    assert bobs["agent"] == {"kind": KIND, "name": "help", "account": "acme"}
    assert [m["text"] for m in bobs["messages"]] == ["hello"]


def test_a_path_near_the_agents_socket_is_closed_with_4404(asgi_server: AsgiServer, world: World) -> None:
    cookie = session_cookie(world.users.alice)
    for path in ("/ws/agents/support/", "/ws/agents/support/help", "/ws/agents/support/help/x/", "/ws/agents/"):
        with websocket(f"{asgi_server.ws_url}{path}", origin=asgi_server.url, cookie=cookie, timeout=TIMEOUT) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=TIMEOUT)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == CLOSE_NOT_FOUND, path


# --- snapshot, resume, live ------------------------------------------------------------------------------
def test_the_snapshot_comes_first_and_is_the_databases_view(asgi_server: AsgiServer, world: World) -> None:
    # given a conversation, a state, a running turn with three chunks and one queued behind it
    alice, agent = world.users.alice, world.agent
    Agent.objects.filter(pk=agent.pk).update(state={"refunds": {"1042": "awaiting approval"}}, state_version=3)
    Message.objects.create(agent=agent, role="user", text="refund 1042", author=alice)
    running = make_turn(agent, number=1)
    queued = make_turn(agent, number=2, status=TurnStatus.QUEUED)
    write(running, [1, 2, 3], push=False)

    with open_chat(asgi_server, alice) as ws:
        snapshot = receive(ws)

    assert snapshot == {"type": "snapshot", **as_json(selectors.agent_snapshot(agent=agent))}
    assert snapshot["turn"] == {"id": str(running.pk), "number": 1, "status": "running", "seq": 3}
    assert [q["id"] for q in snapshot["queued"]] == [str(queued.pk)]
    assert (snapshot["state"], snapshot["state_version"]) == ({"refunds": {"1042": "awaiting approval"}}, 3)


def test_a_reconnect_since_its_newest_message_gets_what_it_missed_and_its_resume_at_once(
    asgi_server: AsgiServer, world: World
) -> None:
    # given a page that had the first two messages when its connection dropped, and meanwhile a
    # third message and a running turn with four chunks, of which it had drawn two
    alice, agent = world.users.alice, world.agent
    had = [Message.objects.create(agent=agent, role="user", text=f"m{i}", author=alice) for i in range(2)]
    missed = Message.objects.create(agent=agent, role="user", text="m2", author=alice)
    turn = make_turn(agent)
    write(turn, range(1, 5), push=False)

    # when it reconnects naming its newest message, and sends its resume before the snapshot comes
    with open_chat(asgi_server, alice, query=f"?since={had[-1].pk}") as ws:
        ws.send(json.dumps({"type": "resume", "turn": str(turn.pk), "after": 2}))
        snapshot = receive(ws)
        replayed = receive_until(ws, is_replay_complete)

    # then the snapshot holds only the message it missed, and the rest of the turn follows it
    assert [m["id"] for m in snapshot["messages"]] == [missed.pk]
    assert (snapshot["since"], snapshot["more"]) == (had[-1].pk, False)
    assert snapshot["turn"]["seq"] == 4
    assert [(f["type"], f.get("seq")) for f in replayed] == [("chunk", 3), ("chunk", 4), ("replay_complete", 4)]


def test_a_since_that_is_not_a_message_id_gets_an_error_then_the_whole_snapshot(
    asgi_server: AsgiServer, world: World
) -> None:
    Message.objects.create(agent=world.agent, role="user", text="hello", author=world.users.alice)

    for bad in ("x", "-1", "1.5", "%C2%B2", "9" * 19):
        with open_chat(asgi_server, world.users.alice, query=f"?since={bad}") as ws:
            error, snapshot = receive(ws), receive(ws)
        assert error == {"type": "error", "message": "'since' must be a message id"}, bad
        assert [m["text"] for m in snapshot["messages"]] == ["hello"], bad
        assert snapshot["since"] is None
    # and one given twice is neither read as its first nor as its last
    with open_chat(asgi_server, world.users.alice, query="?since=1&since=999") as ws:
        error, snapshot = receive(ws), receive(ws)
    assert error == {"type": "error", "message": "'since' is given more than once; give it once"}
    assert [m["text"] for m in snapshot["messages"]] == ["hello"] and snapshot["since"] is None


def test_resume_replays_then_live_chunks_follow_with_no_gap_and_no_duplicate(
    asgi_server: AsgiServer, world: World
) -> None:
    # given a running turn with five chunks stored
    turn = make_turn(world.agent)
    write(turn, range(1, 6))

    with open_chat(asgi_server, world.users.alice) as ws:
        snapshot = receive(ws)
        assert snapshot["turn"]["seq"] == 5

        # when the page resumes after the two it rendered before a reload
        ws.send(json.dumps({"type": "resume", "turn": str(turn.pk), "after": 2}))
        replayed = receive_until(ws, is_replay_complete)

        # then 3..5 come marked as replayed, then the end of the replay
        assert [(f["seq"], f["chunk_type"], f["data"], f.get("replay")) for f in replayed[:-1]] == [
            (seq, "text-delta", {"delta": f"w{seq} "}, True) for seq in (3, 4, 5)
        ]
        assert replayed[-1] == {"type": "replay_complete", "turn": str(turn.pk), "seq": 5}

        # when the writer goes on: a batch, a batch whose push is lost, another batch
        write(turn, [6, 7])
        write(turn, [8, 9], push=False)
        write(turn, [10])
        live = [receive(ws) for _ in range(5)]

        # then every chunk comes once, in order, live (the lost two filled in from the database)
        assert chunk_seqs(live) == [6, 7, 8, 9, 10]
        assert not any("replay" in f for f in live)
        assert all(f["turn"] == str(turn.pk) for f in live)

        # and resuming again sends nothing twice; an earlier resume sends only the older chunks
        ws.send(json.dumps({"type": "resume", "turn": str(turn.pk), "after": 2}))
        assert receive(ws) == {"type": "replay_complete", "turn": str(turn.pk), "seq": 10}
        ws.send(json.dumps({"type": "resume", "turn": str(turn.pk), "after": 0}))
        older = receive_until(ws, is_replay_complete)
        assert [(f["type"], f["seq"], f.get("replay")) for f in older] == [
            ("chunk", 1, True),
            ("chunk", 2, True),
            ("replay_complete", 10, None),
        ]
        # a push that arrives late for a chunk already sent is dropped
        write(turn, [11])
        assert chunk_seqs([receive(ws)]) == [11]


def test_a_long_replay_comes_in_pages_each_chunk_once_in_order(asgi_server: AsgiServer, world: World) -> None:
    # given a turn with more chunks stored than one page of a replay
    turn = make_turn(world.agent)
    total = 2 * REPLAY_PAGE + 50
    write(turn, range(1, total + 1), push=False)

    with open_chat(asgi_server, world.users.alice) as ws:
        receive(ws)
        # when a page resumes it from the start, then from the middle
        ws.send(json.dumps({"type": "resume", "turn": str(turn.pk), "after": 0}))
        first = receive_until(ws, is_replay_complete)
        ws.send(json.dumps({"type": "resume", "turn": str(turn.pk), "after": 0}))
        again = receive_until(ws, is_replay_complete)

    # then every chunk came once, in order, across the pages; the second resume sends nothing twice
    assert chunk_seqs(first[:-1]) == list(range(1, total + 1))
    assert first[-1] == {"type": "replay_complete", "turn": str(turn.pk), "seq": total}
    assert again == [{"type": "replay_complete", "turn": str(turn.pk), "seq": total}]


def test_resume_after_more_than_is_stored_counts_as_the_stored_top(asgi_server: AsgiServer, world: World) -> None:
    with open_chat(asgi_server, world.users.alice) as ws:
        receive(ws)
        # given a turn that starts after the snapshot, with two chunks stored
        turn = make_turn(world.agent)
        write(turn, [1, 2], push=False)

        # when a client resumes it after a number of its own far beyond them
        ws.send(json.dumps({"type": "resume", "turn": str(turn.pk), "after": 2**31}))

        # then the replay ends at what is stored, and every later chunk still comes live
        assert receive(ws) == {"type": "replay_complete", "turn": str(turn.pk), "seq": 2}
        write(turn, [3, 4])
        assert chunk_seqs([receive(ws) for _ in range(2)]) == [3, 4]
        # and an earlier resume still replays the older ones
        ws.send(json.dumps({"type": "resume", "turn": str(turn.pk), "after": 0}))
        older = receive_until(ws, is_replay_complete)
        assert [(f["type"], f["seq"]) for f in older] == [("chunk", 1), ("chunk", 2), ("replay_complete", 4)]


def test_resume_before_the_first_token_then_the_stream_arrives_from_seq_1(
    asgi_server: AsgiServer, world: World
) -> None:
    # given a turn that has started but not streamed yet
    turn = make_turn(world.agent)

    with open_chat(asgi_server, world.users.alice) as ws:
        assert receive(ws)["turn"]["seq"] == 0
        ws.send(json.dumps({"type": "resume", "turn": str(turn.pk), "after": 0}))
        assert receive(ws) == {"type": "replay_complete", "turn": str(turn.pk), "seq": 0}

        # when the first batch's push is lost and the second arrives
        write(turn, [1, 2], push=False)
        write(turn, [3])

        # then 1..3 arrive live, in order
        assert chunk_seqs([receive(ws) for _ in range(3)]) == [1, 2, 3]


def test_a_turn_that_starts_after_the_snapshot_streams_from_its_first_chunk(
    asgi_server: AsgiServer, world: World
) -> None:
    # given an earlier turn that ended before alice connected
    ended = make_turn(world.agent, number=1, status=TurnStatus.COMPLETED)
    write(ended, [1, 2], push=False)

    with open_chat(asgi_server, world.users.alice) as ws:
        snapshot = receive(ws)
        assert snapshot["turn"] is None

        # when a late push of the ended turn arrives, then a new turn streams (its first push lost)
        write(ended, [3])
        turn = make_turn(world.agent, number=2)
        write(turn, [1], push=False)
        write(turn, [2, 3])
        frames = [receive(ws) for _ in range(3)]

    # then the ended turn's late push is not sent (its answer is in the messages), the new one is whole
    assert [(f["turn"], f["seq"]) for f in frames] == [(str(turn.pk), 1), (str(turn.pk), 2), (str(turn.pk), 3)]


def test_live_chunks_written_during_a_long_replay_are_neither_lost_nor_repeated(
    asgi_server: AsgiServer, world: World
) -> None:
    # given 300 chunks stored
    turn = make_turn(world.agent)
    write(turn, range(1, 301), push=False)

    with open_chat(asgi_server, world.users.alice) as ws:
        assert receive(ws)["turn"]["seq"] == 300

        # when 40 more are written, in batches of 4, while the replay is being answered
        def writer_step() -> None:
            for start in range(301, 341, 4):
                write(turn, range(start, start + 4))

        writer = thread_of(writer_step)
        writer.start()
        ws.send(json.dumps({"type": "resume", "turn": str(turn.pk), "after": 0}))
        frames = receive_until(ws, is_replay_complete)
        writer.join()
        while max(chunk_seqs(frames)) < 340:
            frames.append(receive(ws))

    # then every seq arrived exactly once, the stored ones as replayed
    assert sorted(chunk_seqs(frames)) == list(range(1, 341))
    assert all(f.get("replay") is True for f in frames if f["type"] == "chunk" and f["seq"] <= 300)


def test_two_tabs_get_the_same_stream(asgi_server: AsgiServer, world: World) -> None:
    turn = make_turn(world.agent)
    write(turn, [1], push=False)

    with open_chat(asgi_server, world.users.alice) as first, open_chat(asgi_server, world.users.bob) as second:
        for ws in (first, second):
            assert receive(ws)["turn"]["seq"] == 1
        write(turn, [2, 3])
        write(turn, [4], push=False)
        write(turn, [5])
        seen = [[receive(ws) for _ in range(4)] for ws in (first, second)]

    assert seen[0] == seen[1]
    assert chunk_seqs(seen[0]) == [2, 3, 4, 5]


def test_turn_message_and_state_pushes_are_forwarded_and_an_older_state_is_dropped(
    asgi_server: AsgiServer, world: World
) -> None:
    agent = world.agent
    Agent.objects.filter(pk=agent.pk).update(state={"step": "one"}, state_version=2)
    turn = make_turn(agent, status=TurnStatus.QUEUED)
    message = Message.objects.create(agent=agent, turn=turn, role="user", text="hi", author=world.users.alice)

    with open_chat(asgi_server, world.users.alice) as ws:
        assert receive(ws)["state_version"] == 2
        with transaction.atomic():
            push_later(agent.pk, {"type": "agent.message", "message": selectors.message_data(message)})
            push_later(agent.pk, {"type": "agent.turn", "turn": selectors.turn_data(turn)})
            push_later(agent.pk, {"type": "agent.state", "version": 2, "state": {"step": "stale"}})
            push_later(agent.pk, {"type": "agent.state", "version": 3, "state": {"step": "two"}})
        assert publisher.flush(TIMEOUT)
        frames = [receive(ws) for _ in range(3)]

    assert frames == [
        {"type": "message", **as_json(selectors.message_data(message))},
        {"type": "turn", "id": str(turn.pk), "number": 1, "status": "queued", "end_reason": ""},
        {"type": "state", "version": 3, "state": {"step": "two"}},
    ]


def test_a_fiber_change_older_than_one_sent_is_dropped(asgi_server: AsgiServer, world: World) -> None:
    def fiber(status: str, attempts: int, reason: str = "") -> dict[str, object]:
        data = {"id": "f1", "name": "count", "status": status, "stash_version": 0, "attempts": attempts}
        return {"type": "agent.fiber", "fiber": {**data, "end_reason": reason}}

    with open_chat(asgi_server, world.users.alice) as ws:
        assert receive(ws)["type"] == "snapshot"
        # the worker's pushes overtake the starting process's 'pending', and a recovery's
        with transaction.atomic():
            for status, attempts in [("running", 1), ("pending", 0), ("running", 2), ("running", 1), ("completed", 2)]:
                push_later(world.agent.pk, fiber(status, attempts))
        # and a cancel pushes twice at one stage: its run's terminate, then who cancelled it
        with transaction.atomic():
            push_later(world.agent.pk, fiber("cancelled", 3, reason="its run was terminated"))
            push_later(world.agent.pk, fiber("cancelled", 3, reason="cancelled by bob"))
        assert publisher.flush(TIMEOUT)
        frames = [receive(ws) for _ in range(5)]

    assert [(f["status"], f["attempts"]) for f in frames] == [
        ("running", 1),
        ("running", 2),
        ("completed", 2),
        ("cancelled", 3),
        ("cancelled", 3),
    ]
    assert frames[-1]["end_reason"] == "cancelled by bob"


def test_a_turn_status_of_an_earlier_stage_than_one_sent_is_dropped(asgi_server: AsgiServer, world: World) -> None:
    # given a queued turn, and alice's tab
    turn = make_turn(world.agent, status=TurnStatus.QUEUED)

    def status(value: str, reason: str = "") -> dict[str, object]:
        return {"type": "agent.turn", "turn": {**selectors.turn_data(turn), "status": value, "end_reason": reason}}

    with open_chat(asgi_server, world.users.alice) as ws:
        assert receive(ws)["type"] == "snapshot"
        # when she stops it: her answer leaves at once, then the stop's own pushes (the stream's
        # 'finish', the turn's end) come through the channel layer
        ws.send(json.dumps({"type": "stop", "turn": str(turn.pk)}))
        answer = receive(ws)
        receive_until(ws, lambda f: f["type"] == "chunk" and f["chunk_type"] == "finish")
        # and then pushes of earlier stages arrive late (the worker's 'running', pushed just before
        # the stop, still on its way), one the same as her answer, and one of the same stage that
        # says something new; a state push marks the end
        with transaction.atomic():
            for value in ["running", "waiting", "running"]:
                push_later(world.agent.pk, status(value))
            push_later(world.agent.pk, status("cancelled", reason="stopped by alice"))
            push_later(world.agent.pk, status("cancelled", reason="stopped by alice, again"))
            push_later(world.agent.pk, {"type": "agent.state", "version": 99, "state": {}})
        assert publisher.flush(TIMEOUT)
        late = [f for f in receive_until(ws, lambda f: f["type"] == "state") if f["type"] == "turn"]

    # then the tab never reads the turn running again after it ended, nor the same frame twice
    assert (answer["type"], answer["status"], answer["end_reason"]) == ("turn", "cancelled", "stopped by alice")
    assert [(f["status"], f["end_reason"]) for f in late] == [("cancelled", "stopped by alice, again")]


def test_a_turn_runs_waits_and_runs_again_and_each_change_is_sent(asgi_server: AsgiServer, world: World) -> None:
    turn = make_turn(world.agent, status=TurnStatus.QUEUED)
    changes = ["running", "waiting", "running", "completed"]

    with open_chat(asgi_server, world.users.alice) as ws:
        assert receive(ws)["type"] == "snapshot"
        with transaction.atomic():
            for value in ["queued", *changes]:
                data = {**selectors.turn_data(turn), "status": value}
                push_later(world.agent.pk, {"type": "agent.turn", "turn": data})
        assert publisher.flush(TIMEOUT)
        frames = [receive(ws) for _ in range(5)]

    assert [f["status"] for f in frames] == ["queued", *changes]


# --- bad input ------------------------------------------------------------------------------------------
def test_bad_client_messages_get_an_error_the_socket_stays_open_and_nothing_is_stored(
    asgi_server: AsgiServer, world: World
) -> None:
    # given a turn of alice's agent that has ended, and a turn of mallory's agent
    ended = make_turn(world.agent, status=TurnStatus.COMPLETED)
    mallorys_agent = Agent.objects.create(account=world.other, kind=KIND, name="help")
    foreign = make_turn(mallorys_agent)
    write(foreign, [1], push=False)
    bad: list[str | bytes] = [
        "not json",
        b"\x00binary",
        "[" * 40_000,
        "[]",
        json.dumps({"type": "bogus"}),
        json.dumps({"type": "x" * 10_000}),
        json.dumps({"type": "message"}),
        json.dumps({"type": "message", "text": ""}),
        json.dumps({"type": "message", "text": "   "}),
        json.dumps({"type": "message", "text": 5}),
        json.dumps({"type": "message", "text": "a\x00b"}),
        json.dumps({"type": "message", "text": "\ud800"}),
        json.dumps({"type": "message", "text": "x" * (max_text_chars() + 1)}),
        json.dumps({"type": "message", "text": "x" * max_frame_chars()}),
        json.dumps({"type": "resume", "after": 0}),
        json.dumps({"type": "resume", "turn": str(foreign.pk), "after": 0}),
        json.dumps({"type": "resume", "turn": str(uuid4()), "after": 0}),
        json.dumps({"type": "resume", "turn": "nope", "after": 0}),
        json.dumps({"type": "resume", "turn": 7, "after": 0}),
        # forms UUID() takes and no URL of the API does
        json.dumps({"type": "resume", "turn": ended.pk.hex, "after": 0}),
        json.dumps({"type": "resume", "turn": str(ended.pk).upper(), "after": 0}),
        json.dumps({"type": "resume", "turn": f"{{{ended.pk}}}", "after": 0}),
        json.dumps({"type": "resume", "turn": f"urn:uuid:{ended.pk}", "after": 0}),
        json.dumps({"type": "resume", "turn": str(ended.pk)}),
        json.dumps({"type": "resume", "turn": str(ended.pk), "after": -1}),
        json.dumps({"type": "resume", "turn": str(ended.pk), "after": "3"}),
        json.dumps({"type": "resume", "turn": str(ended.pk), "after": True}),
        json.dumps({"type": "resume", "turn": str(ended.pk), "after": 2**60}),
        json.dumps({"type": "stop"}),  # nothing is running
        json.dumps({"type": "stop", "turn": str(ended.pk)}),
        json.dumps({"type": "stop", "turn": str(foreign.pk)}),
        json.dumps({"type": "stop", "turn": ["x"]}),
        # a field its type does not have: a mistake, never a default (this stop would stop the running turn)
        json.dumps({"type": "stop", "turn_id": str(ended.pk)}),
        json.dumps({"type": "message", "text": "hi", "extra": 1}),
        json.dumps({"type": "resume", "turn": str(ended.pk), "after": 0, "from": 0}),
    ]
    before = stored_counts()

    with open_chat(asgi_server, world.users.alice) as ws:
        assert receive(ws)["type"] == "snapshot"
        for message in bad:
            ws.send(message)
            answer = receive(ws)
            assert answer["type"] == "error" and answer["message"], message
            assert "too many messages" not in answer["message"], message
            # naming the type of the message refused, when it is one a client may send (and the
            # frame was read: one over the frame limit is refused unparsed)
            read = isinstance(message, str) and message.startswith("{") and len(message) <= max_frame_chars()
            sent = json.loads(message) if read else None
            assert answer.get("about") == (
                sent["type"] if sent and sent["type"] in ("message", "resume", "stop") else None
            )
            assert len(answer["message"]) < 300, message  # a bounded quote of what was sent
            time.sleep(1 / settings.WEBSOCKET_MAX_FRAMES_PER_SECOND)  # as a client within its rate

        # the socket still works
        ws.send(json.dumps({"type": "resume", "turn": str(ended.pk), "after": 0}))
        assert receive(ws) == {"type": "replay_complete", "turn": str(ended.pk), "seq": 0}

    assert stored_counts() == before
    assert Turn.objects.get(pk=foreign.pk).status == TurnStatus.RUNNING


# --- writes through agents.services (message_send, turn_stop) ----------------------------------------------
def test_a_message_starts_a_turn_every_tab_hears_of(asgi_server: AsgiServer, world: World) -> None:
    with open_chat(asgi_server, world.users.alice) as alice, open_chat(asgi_server, world.users.bob) as bob:
        receive(alice), receive(bob)

        # when alice sends a message
        alice.send(json.dumps({"type": "message", "text": "Where is order 1042?"}))

        # then her tab gets the turn, and both hear of the message and the turn
        answer = receive(alice)
        assert answer["type"] == "turn" and answer["number"] == 1
        turn = Turn.objects.get(pk=answer["id"])
        assert turn.agent_id == world.agent.pk and turn.requested_by == world.users.alice
        message = Message.objects.get(turn=turn, role="user")
        assert message.text == "Where is order 1042?"
        frames = receive_until(alice, lambda f: f["type"] == "message" and f["id"] == message.pk)
        assert frames[-1]["text"] == "Where is order 1042?"
        # bob hears of both, in whichever order they come
        heard: dict[str, Any] = {}
        while len(heard) < 2:
            frame = receive(bob)
            if (frame["type"], frame.get("id")) in (("message", message.pk), ("turn", str(turn.pk))):
                heard[frame["type"]] = frame
        assert heard["message"]["text"] == "Where is order 1042?"


def test_stop_cancels_the_running_turn(asgi_server: AsgiServer, world: World) -> None:
    turn = make_turn(world.agent, status=TurnStatus.QUEUED)

    with open_chat(asgi_server, world.users.alice) as ws:
        receive(ws)
        ws.send(json.dumps({"type": "stop", "turn": str(turn.pk)}))
        answer = receive_until(ws, lambda f: f["type"] == "turn" and f["status"] == "cancelled")[-1]

    assert answer["id"] == str(turn.pk)
    wait_for(lambda: Turn.objects.get(pk=turn.pk).status == TurnStatus.CANCELLED, timeout=TIMEOUT)


def test_a_resume_asked_again_reads_only_what_this_socket_has_not_sent(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given an ended turn of 500 stored chunks, and the stored reads the socket makes, counted by
    # where each starts (in process, on the consumer itself: a server's reads cannot be counted)
    turn = make_turn(world.agent, status=TurnStatus.COMPLETED)
    write(turn, range(1, 501), push=False)
    reads: list[int] = []
    chunks_after = selectors.chunks_after

    def counted(**kwargs: Any) -> Any:
        reads.append(kwargs["after"])
        return chunks_after(**kwargs)

    monkeypatch.setattr(selectors, "chunks_after", counted)
    resume = {"type": "resume", "turn": str(turn.pk), "after": 0}
    session = session_of(login(world.users.alice))

    async def run() -> list[list[Frame]]:
        communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/agents/{KIND}/help/")
        communicator.scope.update(user=world.users.alice, session=session)
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        assert (await communicator.receive_json_from(timeout=TIMEOUT))["type"] == "snapshot"
        replies = []
        for _ in range(3):
            await communicator.send_json_to(resume)
            frames = [await communicator.receive_json_from(timeout=TIMEOUT)]
            while frames[-1]["type"] != "replay_complete":
                frames.append(await communicator.receive_json_from(timeout=TIMEOUT))
            replies.append(frames)
        await communicator.disconnect()
        return replies

    first, *again = async_to_sync(run)()

    # then the first resume replays the whole turn, in pages
    assert chunk_seqs(first[:-1]) == list(range(1, 501)) and first[-1]["seq"] == 500
    assert reads[0] == 0 and len(reads) > 2
    # and the same resume again sends nothing twice and reads only past what was sent, once
    assert again == [[{"type": "replay_complete", "turn": str(turn.pk), "seq": 500}]] * 2
    assert reads[-2:] == [500, 500] and len(reads) == len(set(reads[:-2])) + 2
