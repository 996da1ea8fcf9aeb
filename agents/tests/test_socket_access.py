"""An open socket loses what its user lost: signed out, deactivated, removed from the account. What
``connect`` checked is checked again before each client message and, every
WEBSOCKET_RECHECK_SECONDS, before a push (``workflows.consumers.StreamConsumer``), against a real
daphne whose interval is half a second."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import User
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from accounts.models import Membership
from agents.models import Message, Turn
from agents.services import message_send
from agents.tests.test_consumers import KIND, World
from agents.tests.test_consumers import world as world  # noqa: F401  # the fixture, used by name
from config.routing import websocket_urlpatterns
from tests.factories import login, session_of
from tests.support import ROOT, AsgiServer, service_env, serving, websocket
from workflows.consumers import CLOSE_NOT_FOUND, CLOSE_UNAUTHENTICATED
from workflows.models import WorkflowRun
from workflows.streams import publisher
from workflows.tests.test_consumers import TIMEOUT, receive

pytestmark = pytest.mark.django_db(transaction=True)
CHAT = f"/ws/agents/{KIND}/help/"


@pytest.fixture(scope="module")
def server(django_db_setup: None, django_db_blocker: Any) -> Iterator[AsgiServer]:
    with serving(django_db_blocker, WEBSOCKET_RECHECK_SECONDS="0.5") as process:
        yield process


def signed_in(user: User) -> tuple[Any, str]:
    """A browser's session for ``user``: its client (to sign out with) and its Cookie header."""
    client = login(user)
    return client, f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def open_socket(server: AsgiServer, path: str, cookie: str) -> ClientConnection:
    return websocket(f"{server.ws_url}{path}", origin=server.url, cookie=cookie, timeout=TIMEOUT)


def closed_with(ws: ClientConnection) -> tuple[int, list[dict[str, Any]]]:
    """Read until the server closes: its close code, and what it sent first."""
    sent = []
    try:
        while True:
            sent.append(receive(ws))
    except ConnectionClosed as closed:
        assert closed.rcvd is not None
        return closed.rcvd.code, sent


def test_a_signed_out_user_can_no_longer_send_on_a_socket_opened_before(server: AsgiServer, world: World) -> None:
    # given bob's chat open
    client, cookie = signed_in(world.users.bob)
    with open_socket(server, CHAT, cookie) as ws:
        assert receive(ws)["type"] == "snapshot"
        # when he signs out (in another tab), then the socket sends a message (if the sign-out's
        # push has not closed it already)
        assert client.post("/accounts/logout/").status_code == 302
        try:
            ws.send('{"type": "message", "text": "still here?"}')
        except ConnectionClosed:
            pass

        # then it is closed as unauthenticated, and nothing was stored
        code, sent = closed_with(ws)
    assert code == CLOSE_UNAUTHENTICATED and sent == []
    assert not Turn.objects.exists() and not Message.objects.exists()


def test_a_member_removed_from_the_account_can_no_longer_send_or_read(server: AsgiServer, world: World) -> None:
    # given bob's chat open, then bob removed from acme
    _, cookie = signed_in(world.users.bob)
    with open_socket(server, CHAT, cookie) as ws:
        assert receive(ws)["type"] == "snapshot"
        Membership.objects.filter(user=world.users.bob, account=world.acme).delete()

        # when alice, still a member, writes in the agent's conversation, after the check's interval
        time.sleep(0.6)
        message_send(agent=world.agent, user=world.users.alice, text="our secret plan")
        assert publisher.flush(TIMEOUT)

        # then bob's socket is closed instead of being sent it
        code, sent = closed_with(ws)
    assert code == CLOSE_NOT_FOUND
    assert "our secret plan" not in str(sent)


def test_a_removed_member_sending_at_once_is_refused_without_waiting_for_the_interval(
    server: AsgiServer, world: World
) -> None:
    _, cookie = signed_in(world.users.bob)
    with open_socket(server, CHAT, cookie) as ws:
        assert receive(ws)["type"] == "snapshot"
        Membership.objects.filter(user=world.users.bob, account=world.acme).delete()
        ws.send('{"type": "message", "text": "still here after removal"}')
        code, sent = closed_with(ws)
    assert code == CLOSE_NOT_FOUND and sent == []
    assert not Turn.objects.exists()


def test_a_deactivated_user_loses_a_run_socket_too(server: AsgiServer, world: World) -> None:
    # given bob watching his own run
    run = WorkflowRun.objects.create(workflow="test.echo", owner=world.users.bob, payload={})
    _, cookie = signed_in(world.users.bob)
    with open_socket(server, f"/ws/runs/{run.pk}/", cookie) as ws:
        assert receive(ws)["type"] == "snapshot"

        # when he is deactivated, then asks for a fresh snapshot
        User.objects.filter(pk=world.users.bob.pk).update(is_active=False)
        ws.send('{"type": "snapshot"}')

        # then the socket is closed as unauthenticated, with no snapshot sent
        code, sent = closed_with(ws)
    assert code == CLOSE_UNAUTHENTICATED and sent == []


# --- at once: the user's access changed (workflows.access) ------------------------------------------
@pytest.fixture(scope="module")
def patient_server(django_db_setup: None, django_db_blocker: Any) -> Iterator[AsgiServer]:
    """A daphne that checks again only on a client's message or the access group's push: its
    interval is an hour, so a socket closed without a message was closed by the push."""
    with serving(django_db_blocker, WEBSOCKET_RECHECK_SECONDS="3600") as process:
        yield process


def still_open(ws: ClientConnection) -> bool:
    """Nothing sent and not closed for a second."""
    try:
        ws.recv(timeout=1)
    except TimeoutError:
        return True
    except ConnectionClosed:
        return False
    return True


def test_signing_out_closes_that_sessions_sockets_at_once_and_no_other(
    patient_server: AsgiServer, world: World
) -> None:
    # given bob's chat open in two browsers, and his run in the first
    run = WorkflowRun.objects.create(workflow="test.echo", owner=world.users.bob, payload={})
    first, cookie = signed_in(world.users.bob)
    _, other_cookie = signed_in(world.users.bob)
    with (
        open_socket(patient_server, CHAT, cookie) as chat,
        open_socket(patient_server, f"/ws/runs/{run.pk}/", cookie) as watching,
        open_socket(patient_server, CHAT, other_cookie) as other,
    ):
        for ws in (chat, watching, other):
            assert receive(ws)["type"] == "snapshot"

        # when he signs out in the first browser, and nobody sends anything
        assert first.post("/accounts/logout/").status_code == 302

        # then both of its sockets close as signed out, and the other browser's stays open
        assert closed_with(chat) == (CLOSE_UNAUTHENTICATED, [])
        assert closed_with(watching) == (CLOSE_UNAUTHENTICATED, [])
        assert still_open(other)


def test_removing_a_member_or_deactivating_a_user_closes_their_sockets_at_once(
    patient_server: AsgiServer, world: World
) -> None:
    # given bob's and alice's chats open
    _, bob_cookie = signed_in(world.users.bob)
    _, alice_cookie = signed_in(world.users.alice)
    with open_socket(patient_server, CHAT, bob_cookie) as bob, open_socket(patient_server, CHAT, alice_cookie) as alice:
        assert receive(bob)["type"] == "snapshot" and receive(alice)["type"] == "snapshot"

        # when bob is removed from acme: his chat closes as not found; alice's stays
        Membership.objects.get(user=world.users.bob, account=world.acme).delete()
        assert closed_with(bob) == (CLOSE_NOT_FOUND, [])
        assert still_open(alice)

        # when alice is deactivated (saved, as the admin does): hers closes as signed out
        world.users.alice.is_active = False
        world.users.alice.save()
        assert closed_with(alice) == (CLOSE_UNAUTHENTICATED, [])


def test_a_membership_moved_to_another_user_closes_the_former_members_chat_at_once(
    patient_server: AsgiServer, world: World
) -> None:
    # given bob's chat open
    _, cookie = signed_in(world.users.bob)
    with open_socket(patient_server, CHAT, cookie) as bob:
        assert receive(bob)["type"] == "snapshot"

        # when staff change his membership of acme into dave's (the account's admin inline can)
        membership = Membership.objects.get(user=world.users.bob, account=world.acme)
        membership.user = world.users.dave
        membership.save()

        # then bob's chat closes as not found, at once
        assert closed_with(bob) == (CLOSE_NOT_FOUND, [])


def test_a_member_removed_by_a_short_lived_process_has_his_chat_closed_at_once(
    patient_server: AsgiServer, world: World
) -> None:
    # given bob's chat open
    _, cookie = signed_in(world.users.bob)
    with open_socket(patient_server, CHAT, cookie) as bob:
        assert receive(bob)["type"] == "snapshot"

        # when an operator removes him from acme in a management shell, which exits at once
        remove = "from accounts.models import Membership; Membership.objects.filter(user__username='bob').delete()"
        subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", remove], cwd=ROOT, env=service_env(), check=True, timeout=60
        )

        # then his chat closes as not found, without waiting for a re-check (the server's is an hour):
        # the shell sent its push before it exited
        assert closed_with(bob) == (CLOSE_NOT_FOUND, [])


# --- connect reads the session again: a sign-out just after the handshake ---------------------------
def connect_after_sign_out(user: User, path: str) -> dict[str, Any]:
    """Connect to ``path`` with a scope as the handshake left it (its user read from the session),
    the session signed out just after that read, before connect joined the user's group (so no
    push reached the socket): what connect sends. In process: no server can be paused there."""
    client, _ = signed_in(user)
    scope_session = session_of(client)
    assert client.post("/accounts/logout/").status_code == 302

    async def run() -> dict[str, Any]:
        communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
        communicator.scope.update(user=user, session=scope_session)
        accepted, _ = await communicator.connect(timeout=TIMEOUT)
        assert accepted  # accepted first, so that a close code can be sent
        sent: dict[str, Any] = await communicator.receive_output(timeout=TIMEOUT)
        await communicator.disconnect(code=sent.get("code", 1000), timeout=TIMEOUT)  # as the client answers a close
        return sent

    return async_to_sync(run)()


def test_a_sign_out_just_after_the_handshake_is_seen_by_connect(world: World) -> None:
    run = WorkflowRun.objects.create(workflow="test.echo", owner=world.users.bob, payload={})

    for path in (CHAT, f"/ws/runs/{run.pk}/"):
        sent = connect_after_sign_out(world.users.bob, path)

        # then the socket is closed as unauthenticated, before any snapshot
        assert sent == {"type": "websocket.close", "code": CLOSE_UNAUTHENTICATED, "reason": "signed out"}, path
