"""Clients on the chat socket while a turn's worker dies: a real daphne, real workers, a slow model.

A client stays connected while the worker's process group is SIGKILLed mid-answer (mid-stream, or
after a tool call completed); others connect after the kill and resume, from the start or from a
seq they pretend to have drawn. A new worker recovers the turn. Every client must end with the
turn's stored text, having received each seq 1..N exactly once. Messages are sent from the test
process, so the turn's run goes to this test's own queue, where only its own workers listen.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import ClientConnection

from agents.models import Chunk, Turn, TurnStatus
from agents.services import message_send
from agents.tests.support import assert_seq_complete, chat_agent, chunks, streamed_text, wait_ended
from agents.tests.test_consumers import open_chat
from tests.agents_fixtures import count
from tests.factories import Users
from tests.support import AsgiServer, Worker
from workflows.tests.test_consumers import receive

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

KIND, NAME = "test.chat", "t"
STORY = " ".join(f"w{i}" for i in range(1, 31))
AFTER_TOOL = " ".join(f"d{i}" for i in range(1, 21))
Frame = dict[str, Any]


class Client:
    """A chat socket and every frame it received, in order."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.frames: list[Frame] = []
        self.snapshot = self.next()
        assert self.snapshot["type"] == "snapshot", self.snapshot

    def next(self) -> Frame:
        frame = receive(self.ws)
        self.frames.append(frame)
        return frame

    def read_until(self, done: Callable[[], bool]) -> None:
        while not done():
            self.next()

    def chunks(self, turn: Turn) -> list[Frame]:
        return [f for f in self.frames if f["type"] == "chunk" and f["turn"] == str(turn.pk)]

    def count(self, turn: Turn, chunk_type: str, *, after: int = 0) -> int:
        return sum(1 for f in self.chunks(turn) if f["chunk_type"] == chunk_type and f["seq"] > after)

    def finished(self, turn: Turn) -> bool:
        return self.count(turn, "finish") > 0

    def read_to_end(self, turn: Turn) -> None:
        self.read_until(lambda: self.finished(turn))

    def resume(self, turn: Turn, after: int) -> None:
        self.ws.send(json.dumps({"type": "resume", "turn": str(turn.pk), "after": after}))
        self.read_until(lambda: self.frames[-1]["type"] == "replay_complete")
        assert self.frames[-1]["turn"] == str(turn.pk)


@pytest.fixture
def tab(asgi_server: AsgiServer, users: Users) -> Iterator[Callable[[], Client]]:
    """Opens alice's chat page (a socket to her test agent), closed when the test ends."""
    with ExitStack() as stack:

        def open_tab() -> Client:
            return Client(stack.enter_context(open_chat(asgi_server, users.alice, kind=KIND, name=NAME)))

        yield open_tab


def text_of(frames: list[Frame]) -> str:
    """What a page draws from a turn's chunks, in seq order (``agents.tests.support.streamed_text``
    for frames): text deltas, a reset dropping its round's text, rounds joined by a blank line."""
    rounds: list[str] = [""]
    for f in sorted(frames, key=lambda f: int(f["seq"])):
        if f["chunk_type"] == "text-delta":
            rounds[-1] += f["data"]["delta"]
        elif f["chunk_type"] == "data-reset":
            rounds[-1] = ""
        elif f["chunk_type"] == "tool-output-available":
            rounds.append("")
    return "\n\n".join(r for r in rounds if r)


def drawn(turn: Turn, up_to: int) -> list[Frame]:
    """The chunks a page that drew seqs 1..``up_to`` before a reload holds, as frames."""
    return [
        {"type": "chunk", "turn": str(turn.pk), "seq": c.seq, "chunk_type": c.type, "data": c.data}
        for c in chunks(turn)
        if c.seq <= up_to
    ]


def seqs(frames: list[Frame]) -> list[int]:
    return [int(f["seq"]) for f in frames]


def stored_seq(turn: Turn) -> int:
    return Chunk.objects.filter(turn=turn).count()


def assert_every_client_has_the_whole_answer_once(
    turn: Turn, connected: Client, from_start: Client, from_middle: Client, middle: int
) -> None:
    n = stored_seq(turn)
    for client in (connected, from_start, from_middle):
        client.read_to_end(turn)
    # the client connected throughout: 1..N live, in order, once
    assert seqs(connected.chunks(turn)) == list(range(1, n + 1))
    assert not any(f.get("replay") for f in connected.chunks(turn))
    # the one that resumed from 0: 1..N once, the stored part replayed
    assert sorted(seqs(from_start.chunks(turn))) == list(range(1, n + 1))
    # the one that resumed from a seq it had drawn: the rest once, nothing it had
    assert sorted(seqs(from_middle.chunks(turn))) == list(range(middle + 1, n + 1))
    # and all of them draw the turn's stored text, which is the stream's
    expected = turn.text
    assert text_of(connected.chunks(turn)) == expected
    assert text_of(from_start.chunks(turn)) == expected
    assert text_of(drawn(turn, middle) + from_middle.chunks(turn)) == expected
    assert streamed_text(turn) == expected


def test_clients_connected_and_reconnecting_across_a_sigkill_mid_stream_see_the_answer_once(
    tab: Callable[[], Client], queue: str, workers: list[Worker], users: Users
) -> None:
    # given alice's tab open, and a turn streaming slowly to it
    agent = chat_agent(users.alice)
    connected = tab()
    workers.append(Worker(queue=queue, beat=True))
    turn = message_send(agent=agent, user=users.alice, text="story 30 0.1")
    connected.read_until(lambda: connected.count(turn, "text-delta") >= 5)

    # when the worker's process group is SIGKILLed mid-stream
    workers[0].kill()
    at_kill = stored_seq(turn)
    assert Turn.objects.get(pk=turn.pk).status == TurnStatus.RUNNING

    # and, while no worker runs, a tab that reloaded resumes from the start and another from the
    # middle of what was stored
    from_start, from_middle = tab(), tab()
    middle = max(1, at_kill // 2)
    from_start.resume(turn, 0)
    from_middle.resume(turn, middle)
    assert sorted(seqs(from_start.chunks(turn))) == list(range(1, at_kill + 1))

    # and a new worker recovers the turn
    workers.append(Worker(queue=queue, beat=True))

    # then the turn completes, continued (not retried), and every client has the whole answer once
    turn = wait_ended(turn, timeout=60)
    assert turn.status == TurnStatus.COMPLETED, turn.end_reason
    assert turn.text == STORY
    assert turn.recoveries == 1
    assert not Chunk.objects.filter(turn=turn, type="data-reset").exists()
    assert_seq_complete(turn)
    assert_every_client_has_the_whole_answer_once(turn, connected, from_start, from_middle, middle)


def test_clients_across_a_sigkill_after_a_tool_call_see_the_answer_once_and_the_tool_ran_once(
    tab: Callable[[], Client], queue: str, workers: list[Worker], users: Users, tmp_path: Path
) -> None:
    # given alice's tab open, and a turn whose tool has run and whose answer after it streams slowly
    agent = chat_agent(users.alice)
    path = str(tmp_path / "record")
    connected = tab()
    workers.append(Worker(queue=queue, beat=True))
    turn = message_send(agent=agent, user=users.alice, text=f"record {path} 0.1")
    connected.read_until(lambda: connected.count(turn, "tool-output-available") == 1)
    output = next(f["seq"] for f in connected.chunks(turn) if f["chunk_type"] == "tool-output-available")
    connected.read_until(lambda: connected.count(turn, "text-delta", after=output) >= 3)

    # when the worker is killed, tabs resume from the start and from the tool's output, and a new
    # worker takes over
    workers[0].kill()
    assert count(path) == 1
    from_start, from_middle = tab(), tab()
    from_start.resume(turn, 0)
    from_middle.resume(turn, output)
    workers.append(Worker(queue=queue, beat=True))

    # then the turn completes, the tool ran once, its output is in the stream once, and every client
    # has the whole answer once
    turn = wait_ended(turn, timeout=60)
    assert turn.status == TurnStatus.COMPLETED, turn.end_reason
    assert count(path) == 1
    assert Chunk.objects.filter(turn=turn, type="tool-output-available").count() == 1
    assert turn.text.startswith("Let me do that.\n\nDone: ") and turn.text.endswith(AFTER_TOOL)
    assert_seq_complete(turn)
    assert_every_client_has_the_whole_answer_once(turn, connected, from_start, from_middle, output)


def test_a_client_that_resumes_before_the_first_token_receives_every_chunk_once(
    tab: Callable[[], Client], queue: str, workers: list[Worker], users: Users
) -> None:
    # given a turn that has started but whose run no worker has taken yet: no chunk stored
    agent = chat_agent(users.alice)
    turn = message_send(agent=agent, user=users.alice, text="story 10 0.05")
    assert turn.status == TurnStatus.RUNNING and stored_seq(turn) == 0

    # when a reloaded tab connects and resumes it after seq 0
    client = tab()
    assert client.snapshot["turn"] == {"id": str(turn.pk), "number": 1, "status": "running", "seq": 0}
    client.resume(turn, 0)
    assert client.frames[-1] == {"type": "replay_complete", "turn": str(turn.pk), "seq": 0}

    # and a worker starts and answers
    workers.append(Worker(queue=queue))
    client.read_to_end(turn)

    # then every chunk arrived once, in order, live, and the tab draws the stored answer
    turn = wait_ended(turn)
    assert turn.status == TurnStatus.COMPLETED
    assert seqs(client.chunks(turn)) == list(range(1, stored_seq(turn) + 1))
    assert not any(f.get("replay") for f in client.chunks(turn))
    assert text_of(client.chunks(turn)) == turn.text == " ".join(f"w{i}" for i in range(1, 11))
