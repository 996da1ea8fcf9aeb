"""A worker that held unacknowledged messages when Redis went away is not killed by kombu's attempt
to put them back through a connection it no longer has (``config.broker``)."""

from __future__ import annotations

from typing import Any

import pytest
from kombu.connection import Connection

import config.celery  # noqa: F401  # installs the guard, as every worker does


def test_closing_a_channel_whose_connection_is_gone_skips_the_restore(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # given a Redis channel holding a message it took and did not acknowledge
    connection = Connection(settings.REDIS_URL)  # type: ignore[no-untyped-call]  # kombu has no types here
    channel: Any = connection.default_channel
    channel.qos._delivered["delivery-1"] = None
    # when the consumer, having lost the broker, has let the connection go and closes the channel
    channel.connection.client = None

    channel.close()  # kombu itself raised AttributeError('NoneType' ... 'hostname') here

    # then the restore was skipped, said in the log, and nothing is left to restore twice
    assert channel.closed
    assert not channel.qos._delivered
    assert "1 unacknowledged message(s) left to Redis's visibility timeout" in caplog.text
