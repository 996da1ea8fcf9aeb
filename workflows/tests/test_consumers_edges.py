"""``/ws/...`` at its edges, against a real daphne: a socket left idle, paths that name no socket.

The daphne log is read back to prove each case leaves no error and no traceback behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from channels_redis.pubsub import RedisPubSubChannelLayer
from websockets.exceptions import ConnectionClosed

from tests.factories import Users, make_run
from tests.support import AsgiServer, Worker, wait_for_status, websocket
from workflows import public as wf
from workflows.consumers import CLOSE_NOT_FOUND
from workflows.models import RunStatus
from workflows.tests.test_consumers import (
    TIMEOUT,
    is_final_status,
    open_socket,
    receive,
    receive_until,
    refusal,
    session_cookie,
    settled_stream,
)

pytestmark = pytest.mark.django_db(transaction=True)

# channels_redis's list layer blocks in Redis for 5 s at a time; idle for more than two of those
# (the pub/sub layer, the default, polls its subscription every 0.1 s).
IDLE_SECONDS = 12.5


def new_log(asgi_server: AsgiServer, start: int) -> str:
    with Path(asgi_server.log.name).open("rb") as log:
        log.seek(start)
        return log.read().decode(errors="replace")


def log_size(asgi_server: AsgiServer) -> int:
    return Path(asgi_server.log.name).stat().st_size


# --- an idle socket ---------------------------------------------------------------------------------
def test_an_idle_socket_stays_open_and_still_gets_live_events(
    asgi_server: AsgiServer, worker: Worker, users: Users
) -> None:
    # given a run waiting for a reply, and its owner's socket with the snapshot read
    alice = users.alice
    run = wf.start("test.wait", {"timeout": 120}, owner=alice)
    wait_for_status(run.id, RunStatus.WAITING, timeout=TIMEOUT)
    settled = settled_stream(run.id, RunStatus.WAITING)
    start = log_size(asgi_server)

    with open_socket(asgi_server, run.id, alice) as ws:
        assert receive(ws)["seq"] == settled

        # when nothing happens for longer than two of the channel layer's blocking reads
        with pytest.raises(TimeoutError):  # not ConnectionClosed: the socket is still open
            ws.recv(timeout=IDLE_SECONDS)

        # then the socket still follows the run: the reply's status changes arrive live
        wf.send_event(run, "reply", {"text": "yes"})
        live = receive_until(ws, is_final_status)

    assert [m["seq"] for m in live] == list(range(settled + 1, settled + 1 + len(live)))
    assert live[-1]["data"]["status"] == "completed"
    log = new_log(asgi_server, start)
    assert "Traceback" not in log and "TimeoutError" not in log, log


def test_the_list_layers_read_timeout_is_above_its_blocking_read(settings: Any) -> None:
    """The list layer (CHANNEL_LAYER_BACKEND=channels_redis.core.RedisChannelLayer) with the
    project's CONFIG: the socket timeout its connections really get, whatever redis-py's default is,
    lets its blocking read finish (the test above proves the default layer end to end)."""
    layer = RedisChannelLayer(**settings.CHANNEL_LAYERS["default"]["CONFIG"])
    timeout = layer.create_pool(0).connection_kwargs.get("socket_timeout")
    assert timeout is not None and timeout >= 2 * RedisChannelLayer.brpop_timeout


def test_the_default_layer_is_redis_pub_sub() -> None:
    """One PUBLISH per push, fanned out in each ASGI process (config/settings.py says why)."""
    assert isinstance(get_channel_layer(), RedisPubSubChannelLayer)


# --- paths that name no socket --------------------------------------------------------------------
def unrouted_paths(run_id: str) -> list[str]:
    return [
        "/ws/runs/zzz/",
        f"/ws/runs/{run_id}",  # no trailing slash
        f"/ws/runs/{run_id}/extra/",
        f"/ws/runs/{run_id.replace('-', '')}/",  # UUID() takes it; the socket, like the API, does not
        f"/ws/runs/{{{run_id}}}/",
        "/ws/nothing",
        "/ws/",
        "/",
        "/api/runs",
        "/ws/runs/%00/",
    ]


def closed_with(url: str, cookie: str | None, origin: str) -> tuple[int | None, list[str]]:
    sent: list[str] = []
    with websocket(url, origin=origin, cookie=cookie, timeout=TIMEOUT) as ws:
        try:
            while True:
                sent.append(str(ws.recv(timeout=TIMEOUT)))
        except ConnectionClosed as closed:
            assert closed.rcvd is not None
            return closed.rcvd.code, sent


@pytest.mark.parametrize("signed_in", [False, True], ids=["anonymous", "owner"])
def test_a_path_that_names_no_socket_is_closed_with_4404_and_logs_no_error(
    asgi_server: AsgiServer, users: Users, signed_in: bool
) -> None:
    # given alice's run (so a path near its own is a near miss, not a random one)
    run = make_run(owner=users.alice)
    cookie = session_cookie(users.alice) if signed_in else None
    start = log_size(asgi_server)

    # when each path is opened
    answers = {
        path: closed_with(f"{asgi_server.ws_url}{path}", cookie, asgi_server.url)
        for path in unrouted_paths(str(run.id))
    }

    # then each is closed like an unknown run, with nothing sent, and daphne logs no error
    assert answers == {path: (CLOSE_NOT_FOUND, []) for path in answers}
    log = new_log(asgi_server, start)
    assert "Traceback" not in log and "No route found" not in log and " 500 " not in log, log


def test_a_run_id_in_upper_case_is_the_same_run_as_in_the_api(asgi_server: AsgiServer, users: Users) -> None:
    """The API takes a run id in either case (RFC 4122: case-insensitive on input); so does the socket."""
    run = make_run(owner=users.alice)

    with open_socket(asgi_server, str(run.id).upper(), users.alice) as ws:
        snapshot = receive(ws)

    assert (snapshot["type"], snapshot["run"]["id"]) == ("snapshot", str(run.id))
    # and, upper-case or not, another user's run and a missing one are refused alike
    assert refusal(asgi_server, str(run.id).upper(), users.mallory)[0] == CLOSE_NOT_FOUND
    assert refusal(asgi_server, str(uuid4()).upper(), users.alice)[0] == CLOSE_NOT_FOUND
