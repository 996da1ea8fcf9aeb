"""A WebSocket opens only from this site's own origin: the same host AND port the browser connected
to (``config.origin.SameOriginValidator``), or a configured trusted origin."""

from __future__ import annotations

from typing import Any

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from websockets.typing import Origin

from config.origin import origin_allowed
from tests.support import AsgiServer


def handshake(server: AsgiServer, origin: str | None) -> int:
    """The HTTP status of a chat socket's handshake from ``origin`` (101: opened)."""
    try:
        with connect(
            f"{server.ws_url}/ws/agents/test.chat/help/",
            origin=Origin(origin) if origin is not None else None,
            proxy=None,
            open_timeout=10,
        ):
            return 101
    except InvalidStatus as refused:
        return refused.response.status_code


@pytest.mark.django_db(transaction=True)
def test_only_the_sites_own_host_and_port_may_open_a_socket(asgi_server: AsgiServer) -> None:
    # another port of the same host (another local service's page) is another origin
    assert handshake(asgi_server, "http://127.0.0.1:1") == 403
    assert handshake(asgi_server, f"http://localhost:{asgi_server.port}") == 403  # another host name
    assert handshake(asgi_server, "http://evil.example") == 403
    assert handshake(asgi_server, None) == 403
    # the page's own origin reaches the consumer (which then asks who is signed in)
    assert handshake(asgi_server, asgi_server.url) == 101


@pytest.mark.parametrize(
    ("origin", "host", "allowed"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000", True),
        ("http://127.0.0.1:8000", "127.0.0.1:8001", False),
        ("https://chat.example.com", "chat.example.com:443", True),  # the default port, left out of one
        ("http://chat.example.com:80", "chat.example.com", True),
        ("https://chat.example.com", "chat.example.com:8443", False),
        ("http://CHAT.example.com", "chat.example.com", True),
        ("http://not-allowed.example", "not-allowed.example", False),  # same, but not in ALLOWED_HOSTS
        ("https://app.partner.example", "chat.example.com", True),  # a trusted origin
        ("ftp://chat.example.com", "chat.example.com", False),
        ("null", "chat.example.com", False),
        ("http://[::1]:8000", "[::1]:8000", True),
        ("", "chat.example.com", False),
        ("http://chat.example.com", None, False),
    ],
)
def test_what_counts_as_the_same_origin(settings: Any, origin: str, host: str | None, allowed: bool) -> None:
    settings.ALLOWED_HOSTS = ["chat.example.com", "127.0.0.1", "[::1]"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://app.partner.example"]

    assert origin_allowed(origin, host) is allowed
