"""``/ws/...`` at its edges, against a real daphne: a socket left idle.

The daphne log is read back to prove each case leaves no error and no traceback behind.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.contrib.auth.models import User

from tests.support import AsgiServer, Worker, wait_for_status
from workflows import public as wf
from workflows.models import RunStatus
from workflows.tests.test_consumers import (
    TIMEOUT,
    is_final_status,
    open_socket,
    receive,
    receive_until,
    settled_stream,
)

pytestmark = pytest.mark.django_db(transaction=True)

# channels_redis's receive blocks in Redis for 5 s at a time; idle for more than two of those.
IDLE_SECONDS = 12.5


def new_log(asgi_server: AsgiServer, start: int) -> str:
    with Path(asgi_server.log.name).open("rb") as log:
        log.seek(start)
        return log.read().decode(errors="replace")


def log_size(asgi_server: AsgiServer) -> int:
    return Path(asgi_server.log.name).stat().st_size


# --- an idle socket ---------------------------------------------------------------------------------
def test_an_idle_socket_stays_open_and_still_gets_live_events(
    asgi_server: AsgiServer, worker: Worker, users: dict[str, User]
) -> None:
    # given a run waiting for a reply, and its owner's socket with the snapshot read
    alice = users["alice"]
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


def test_the_channel_layers_read_timeout_is_above_its_blocking_read() -> None:
    """What the test above proves end to end, stated for the configuration itself: the socket
    timeout the layer's connections really get, whatever redis-py's default is."""
    layer = get_channel_layer()
    assert isinstance(layer, RedisChannelLayer)
    timeout = layer.create_pool(0).connection_kwargs.get("socket_timeout")
    assert timeout is not None and timeout >= 2 * RedisChannelLayer.brpop_timeout
