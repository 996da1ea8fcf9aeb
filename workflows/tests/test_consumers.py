"""``/ws/runs/<id>/`` against a real daphne process, with events from a real worker or published here.

Every test commits its rows (``transaction=True``) so the server process sees them; sessions come
from ``Client.force_login`` and travel as a Cookie header, with the Origin a browser would send.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection

from tests.factories import Users, login, make_run
from tests.support import AsgiServer, Worker, thread_of, wait_for, wait_for_status, websocket
from workflows import access, streams
from workflows import public as wf
from workflows.consumers import CLOSE_NOT_FOUND, CLOSE_UNAUTHENTICATED, Cursor
from workflows.models import RunAttempt, RunStatus, WorkflowRun
from workflows.selectors import run_snapshot

pytestmark = pytest.mark.django_db(transaction=True)

# Generous: the machine's two cores are shared with other test sessions.
TIMEOUT = 45.0
Message = dict[str, Any]


# --- helpers --------------------------------------------------------------------------------------
def session_cookie(user: User) -> str:
    client = login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def open_socket(
    server: AsgiServer, run_id: UUID | str, user: User | None = None, *, origin: str | None = None
) -> ClientConnection:
    cookie = session_cookie(user) if user is not None else None
    return websocket(f"{server.ws_url}/ws/runs/{run_id}/", origin=origin or server.url, cookie=cookie, timeout=TIMEOUT)


def receive(ws: ClientConnection, timeout: float = TIMEOUT) -> Message:
    message: Message = json.loads(ws.recv(timeout=timeout))
    return message


def receive_until(ws: ClientConnection, done: Callable[[Message], bool], timeout: float = TIMEOUT) -> list[Message]:
    """Every message up to and including the first for which ``done`` is true."""
    messages = [receive(ws, timeout)]
    while not done(messages[-1]):
        messages.append(receive(ws, timeout))
    return messages


def refusal(server: AsgiServer, run_id: UUID | str, user: User | None) -> tuple[int | None, str, list[str]]:
    """Connect and read until the server closes: (close code, reason, anything it sent first)."""
    sent: list[str] = []
    with open_socket(server, run_id, user) as ws:
        try:
            while True:
                sent.append(str(ws.recv(timeout=TIMEOUT)))
        except ConnectionClosed as closed:
            assert closed.rcvd is not None
            return closed.rcvd.code, closed.rcvd.reason, sent


def is_final_status(message: Message) -> bool:
    return message.get("type") == "status" and bool(message["data"]["terminal"])


def stream_events(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m["type"] in ("progress", "status", "broadcast")]


def seqs(messages: list[Message]) -> list[int]:
    return [m["seq"] for m in stream_events(messages)]


def settled_stream(run_id: UUID, status: str) -> int:
    """Wait until the stream's last event says ``status`` (the DB changes first, the publish follows)."""

    def settled() -> int:
        events = streams.events_after(run_id, 0)
        return events[-1]["seq"] if events and events[-1]["data"].get("status") == status else 0

    return wait_for(settled, timeout=TIMEOUT, what=f"the stream to announce {status}")


def as_json(value: Any) -> Any:
    return json.loads(json.dumps(value))


# --- refusals -------------------------------------------------------------------------------------
def test_unauthenticated_socket_is_closed_with_4401_and_sent_nothing(asgi_server: AsgiServer, users: Users) -> None:
    run = make_run(owner=users.alice)

    code, reason, sent = refusal(asgi_server, run.id, None)

    assert (code, sent) == (CLOSE_UNAUTHENTICATED, [])
    assert reason in ("", "authentication required")  # daphne does not forward close reasons


def test_a_foreign_origin_is_refused_before_the_socket_opens(asgi_server: AsgiServer, users: Users) -> None:
    run = make_run(owner=users.alice)

    with pytest.raises(InvalidStatus) as refused:
        open_socket(asgi_server, run.id, users.alice, origin="http://evil.example")

    assert refused.value.response.status_code == 403
    # the same request from the page's own origin is accepted
    with open_socket(asgi_server, run.id, users.alice) as ws:
        assert receive(ws)["type"] == "snapshot"


def test_another_users_run_is_refused_exactly_like_a_missing_one(asgi_server: AsgiServer, users: Users) -> None:
    run = make_run(owner=users.alice)

    someone_elses = refusal(asgi_server, run.id, users.mallory)
    colleagues = refusal(asgi_server, run.id, users.bob)
    missing = refusal(asgi_server, uuid4(), users.mallory)

    assert someone_elses == colleagues == missing
    assert someone_elses[0] == CLOSE_NOT_FOUND and someone_elses[2] == []
    # staff with the view permission see it
    with open_socket(asgi_server, run.id, users.carol) as ws:
        assert receive(ws)["run"]["id"] == str(run.id)


def test_a_refused_socket_that_sends_at_once_is_not_read_and_leaves_its_users_group(
    asgi_server: AsgiServer, users: Users
) -> None:
    # given someone opening alice's run, and sending a resume before the refusal reaches them (as a
    # run page does on every reconnect), ten times
    run = make_run(owner=users.alice)
    stranger = User.objects.create_user(f"stranger-{uuid4().hex[:8]}")  # no socket of theirs before
    log = Path(asgi_server.log.name)
    logged = len(log.read_text())
    for _ in range(10):
        with open_socket(asgi_server, run.id, stranger) as ws:
            try:
                ws.send(json.dumps({"type": "resume", "after": 0}))
            except ConnectionClosed:
                pass  # refused first, this time
            # then each is refused as before, answered nothing
            with pytest.raises(ConnectionClosed) as closed:
                receive(ws)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == CLOSE_NOT_FOUND

    # and the server kept no subscription to their group, and no handler failed
    wait_for(lambda: subscriptions(stranger) == 0, timeout=10, what="the stranger's group left")
    assert "Exception inside application" not in log.read_text()[logged:]


def subscriptions(user: User) -> int:
    """The Redis pub/sub channel layer's subscriptions to ``user``'s access group."""
    layer: dict[str, Any] = settings.CHANNEL_LAYERS["default"]
    channel = f"{layer['CONFIG']['prefix']}__group__{access.group_name(user.pk)}"
    return int(dict(redis.Redis.from_url(settings.REDIS_URL).pubsub_numsub(channel))[channel.encode()])


# --- snapshot and live events from a real worker ------------------------------------------------
def test_snapshot_comes_first_matches_the_database_then_status_events_follow_live(
    asgi_server: AsgiServer, worker: Worker, users: Users
) -> None:
    # given a run that waits for a reply, with its stream settled
    alice = users.alice
    run = wf.start("test.wait", {"timeout": 120}, owner=alice)
    wait_for_status(run.id, RunStatus.WAITING, timeout=TIMEOUT)
    settled = settled_stream(run.id, RunStatus.WAITING)

    with open_socket(asgi_server, run.id, alice) as ws:
        # when alice connects
        snapshot = receive(ws)

        # then the snapshot comes first and is the database's view at the stream's counter
        assert snapshot["type"] == "snapshot"
        assert snapshot["seq"] == settled == streams.current_seq(run.id)
        assert snapshot["run"] == as_json(run_snapshot(run=WorkflowRun.objects.get(pk=run.id), user=alice))
        assert snapshot["run"]["status"] == "waiting"
        assert snapshot["run"]["waiting_for"]["event_type"] == "reply"
        [wait_step] = snapshot["run"]["timeline"]
        assert (wait_step["name"], wait_step["status"]) == ("wait for reply", "waiting")
        assert wait_step["wake_at"] == snapshot["run"]["waiting_for"]["until"]

        # when the reply arrives, the status changes stream in, in order, up to completion
        wf.send_event(run, "reply", {"text": "yes"})
        live = receive_until(ws, is_final_status)

    assert seqs(live) == list(range(settled + 1, settled + 1 + len(live)))
    assert [m["data"]["status"] for m in live][-1] == "completed"
    assert "running" in [m["data"]["status"] for m in live]
    assert not any("replay" in m for m in live)
    result = WorkflowRun.objects.get(pk=run.id).result
    assert result is not None and result["reply"] == {"text": "yes"}


def test_live_progress_events_arrive_in_seq_order_without_gaps(
    asgi_server: AsgiServer, worker: Worker, users: Users
) -> None:
    alice = users.alice
    run = wf.start("test.progress", {"steps": 6, "seconds": 0.5}, owner=alice)

    with open_socket(asgi_server, run.id, alice) as ws:
        snapshot = receive(ws)
        live = receive_until(ws, is_final_status)

    assert snapshot["type"] == "snapshot"
    # every event after the snapshot's seq, each once, in order: exactly what the stream stored
    assert seqs(live) == list(range(snapshot["seq"] + 1, snapshot["seq"] + 1 + len(live)))
    assert seqs(live) == [e["seq"] for e in streams.events_after(run.id, snapshot["seq"])]
    done = [m["data"]["done"] for m in live if m["type"] == "progress"]
    assert done and done == list(range(done[0], 7))  # 3 s of steps: the socket opens well before the end
    assert live[-1]["data"]["status"] == "completed"


def test_reconnect_mid_run_and_resume_gives_every_event_once_up_to_the_final_status(
    asgi_server: AsgiServer, worker: Worker, users: Users
) -> None:
    # given alice watched a run for a while, then lost her connection
    alice = users.alice
    run = wf.start("test.progress", {"steps": 10, "seconds": 0.4}, owner=alice)
    with open_socket(asgi_server, run.id, alice) as ws:
        first_snapshot = receive(ws)
        before = receive_until(ws, lambda m: m["type"] == "progress" and m["data"]["done"] >= 2)
    last_seen = max(seqs(before))
    assert not any(is_final_status(m) for m in before)

    # while she is away the run goes on
    wait_for(lambda: streams.current_seq(run.id) >= last_seen + 2, timeout=TIMEOUT, what="events while away")

    # when she reconnects and resumes after the last seq she saw
    with open_socket(asgi_server, run.id, alice) as ws:
        second_snapshot = receive(ws)
        ws.send(json.dumps({"type": "resume", "after": last_seen}))
        after = receive_until(ws, lambda m: m["type"] == "replay_complete")
        if not any(is_final_status(m) for m in after):
            after += receive_until(ws, is_final_status)

    # then the two connections together give every event once, in order, to the final status
    assert second_snapshot["seq"] > last_seen
    union = seqs(before) + seqs(after)
    stored = [e["seq"] for e in streams.events_after(run.id, first_snapshot["seq"])]
    assert sorted(union) == stored == list(range(first_snapshot["seq"] + 1, stored[-1] + 1))
    assert len(union) == len(set(union))
    missed = [m for m in stream_events(after) if m["seq"] <= second_snapshot["seq"]]
    assert missed and all(m.get("replay") is True for m in missed)
    assert {m["seq"] for m in missed} == set(range(last_seen + 1, second_snapshot["seq"] + 1))
    final = [m for m in stream_events(before + after) if is_final_status(m)]
    assert len(final) == 1 and final[0]["data"]["status"] == "completed"
    assert WorkflowRun.objects.get(pk=run.id).status == RunStatus.COMPLETED


# --- resume, with events published here to control the timing ------------------------------------
def test_resume_replays_what_was_published_while_disconnected_and_nothing_twice(
    asgi_server: AsgiServer, users: Users
) -> None:
    alice = users.alice
    run = make_run(owner=alice)
    with open_socket(asgi_server, run.id, alice) as ws:
        assert receive(ws)["seq"] == 0
        first = streams.publish(run.id, "progress", {"n": 1})
        assert receive(ws) | {"at": None} == {
            "type": "progress",
            "seq": first,
            "run": str(run.id),
            "data": {"n": 1},
            "at": None,
        }

    # given two events published while alice is away
    streams.publish(run.id, "progress", {"n": 2})
    streams.publish(run.id, "status", {"status": "completed", "terminal": True})

    with open_socket(asgi_server, run.id, alice) as ws:
        # when she reconnects and resumes after the one she saw
        assert receive(ws)["seq"] == 3
        ws.send(json.dumps({"type": "resume", "after": 1}))
        replayed = receive_until(ws, lambda m: m["type"] == "replay_complete")

        # then she gets exactly those two, marked as replayed
        assert [(m["seq"], m["data"], m.get("replay")) for m in replayed[:-1]] == [
            (2, {"n": 2}, True),
            (3, {"status": "completed", "terminal": True}, True),
        ]
        assert replayed[-1] == {"type": "replay_complete", "seq": 3}

        # a live event follows, not marked
        streams.publish(run.id, "progress", {"n": 4})
        assert receive(ws) | {"at": None} == {
            "type": "progress",
            "seq": 4,
            "run": str(run.id),
            "data": {"n": 4},
            "at": None,
        }

        # the same resume again sends nothing twice; an earlier one sends only the older event
        ws.send(json.dumps({"type": "resume", "after": 1}))
        assert receive(ws) == {"type": "replay_complete", "seq": 4}
        ws.send(json.dumps({"type": "resume", "after": 0}))
        older = receive_until(ws, lambda m: m["type"] == "replay_complete")
        assert [(m["type"], m["seq"], m.get("replay")) for m in older] == [
            ("progress", 1, True),
            ("replay_complete", 4, None),
        ]
        ws.send(json.dumps({"type": "resume", "after": 0}))
        assert receive(ws) == {"type": "replay_complete", "seq": 4}


def test_live_events_published_during_a_replay_are_neither_lost_nor_repeated(
    asgi_server: AsgiServer, users: Users
) -> None:
    # given 60 events alice missed
    alice = users.alice
    run = make_run(owner=alice)
    for n in range(60):
        streams.publish(run.id, "progress", {"n": n})

    with open_socket(asgi_server, run.id, alice) as ws:
        assert receive(ws)["seq"] == 60
        # when 40 more are published while her resume is being answered
        publisher = thread_of(lambda: [streams.publish(run.id, "progress", {"n": 60 + n}) for n in range(40)])
        publisher.start()
        ws.send(json.dumps({"type": "resume", "after": 0}))
        messages = receive_until(
            ws,
            lambda m: (
                m.get("seq") == 100 and m["type"] == "progress" or (m["type"] == "replay_complete" and m["seq"] == 100)
            ),
        )
        publisher.join()
        # whichever came last (the live 100th event or the replay's end), drain what remains
        while not any(m["type"] == "replay_complete" for m in messages) or max(seqs(messages)) < 100:
            messages.append(receive(ws))

    # then every seq arrived exactly once
    assert sorted(seqs(messages)) == list(range(1, 101))
    assert [m["data"]["n"] for m in stream_events(messages) if m["seq"] <= 60] == list(range(60))
    assert all(m.get("replay") is True for m in stream_events(messages) if m["seq"] <= 60)


def test_a_lost_live_push_is_filled_in_from_the_store_before_the_next_event(
    asgi_server: AsgiServer, users: Users, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = users.alice
    run = make_run(owner=alice)
    with open_socket(asgi_server, run.id, alice) as ws:
        assert receive(ws)["seq"] == 0
        # given an event stored whose live push never happened (the channel layer is best effort)
        with monkeypatch.context() as patched:
            patched.setattr(streams, "get_channel_layer", lambda: None)
            streams.publish(run.id, "status", {"status": "paused", "terminal": False})

        # when the next one is pushed
        streams.publish(run.id, "progress", {"n": 2})

        # then the lost one comes first, then the next, in order, as live events
        received = [receive(ws), receive(ws)]
    assert [(m["seq"], m["type"], m.get("replay")) for m in received] == [(1, "status", None), (2, "progress", None)]


def test_bad_client_messages_get_an_error_and_the_connection_stays_open(asgi_server: AsgiServer, users: Users) -> None:
    alice = users.alice
    run = make_run(owner=alice)
    bad: list[str | bytes] = [
        "not json",
        b"\x00binary",
        "[]",
        json.dumps({"type": "bogus"}),
        json.dumps({"type": "resume"}),
        json.dumps({"type": "resume", "after": -1}),
        json.dumps({"type": "resume", "after": "3"}),
        json.dumps({"type": "resume", "after": True}),
        json.dumps({"type": "resume", "after": 2**60}),
    ]
    with open_socket(asgi_server, run.id, alice) as ws:
        assert receive(ws)["type"] == "snapshot"
        for message in bad:
            ws.send(message)
            answer = receive(ws)
            assert answer["type"] == "error" and answer["message"], message

        # the connection still works
        ws.send(json.dumps({"type": "resume", "after": 0}))
        assert receive(ws) == {"type": "replay_complete", "seq": 0}
        ws.send(json.dumps({"type": "snapshot"}))
        assert receive(ws)["run"]["id"] == str(run.id)


# --- the cursor's bookkeeping, in process ---------------------------------------------------------
def test_cursor_sends_each_seq_once_and_forwards_a_late_one() -> None:
    cursor = Cursor(low=5, high=5)
    assert not cursor.wants_live(5) and cursor.wants_live(6)

    cursor.mark_sent(6)
    cursor.mark_sent(9)  # 7 and 8 were not in the store yet
    assert cursor.high == 9 and cursor.missing == {7, 8}
    assert not cursor.wants_live(6) and cursor.wants_live(7) and not cursor.wants_live(9)

    cursor.mark_sent(7)  # arrived late
    assert cursor.missing == {8} and not cursor.wants_live(7)
    assert not cursor.was_sent(3)  # below the snapshot: a resume may still ask for it


def test_a_traceback_is_for_staff_only_on_the_socket_and_the_page(asgi_server: AsgiServer, users: Users) -> None:
    """The same rule as the API (``selectors.public_error``): file paths and source lines of a
    failed run are for staff who may see every run, never for its owner."""
    # given alice's run failed with a traceback
    alice, carol = users.alice, users.carol
    run = wf.start("test.echo", {}, owner=alice)
    traceback = 'Traceback (most recent call last):\n  File "/srv/app/secret_module.py", line 7'
    error = {"type": "KeyError", "message": "'order_id'", "traceback": traceback}
    WorkflowRun.objects.filter(pk=run.pk).update(status=RunStatus.FAILED, error=error, failure_reason="error")
    RunAttempt.objects.filter(run=run).update(status=RunStatus.FAILED, error=error)

    # when each opens the socket and the page
    seen = {}
    for user in (alice, carol):
        with open_socket(asgi_server, run.id, user) as ws:
            snapshot = receive(ws)
        seen[user.username] = (snapshot["run"], login(user).get(f"/runs/{run.id}/").content.decode())

    # then alice sees what failed, not where in the code; carol sees it all
    alices_run, alices_page = seen["alice"]
    assert alices_run["error"] == {"type": "KeyError", "message": "'order_id'"}
    assert "traceback" not in alices_run["attempts"][0]["error"]
    assert "secret_module.py" not in json.dumps(alices_run) and "secret_module.py" not in alices_page
    carols_run, carols_page = seen["carol"]
    assert carols_run["error"] == error and "secret_module.py" in carols_page
