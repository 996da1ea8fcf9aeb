"""A WebSocket opens only from this site's own origin: the same host AND port the browser connected
to (``config.origin.SameOriginValidator``), or a configured trusted origin."""

from __future__ import annotations

from typing import Any

import pytest
from websockets.exceptions import InvalidStatus

from config.origin import is_secure, origin_allowed
from tests.support import AsgiServer, websocket


def handshake(server: AsgiServer, origin: str | None) -> int:
    """The HTTP status of a chat socket's handshake from ``origin`` (101: opened)."""
    try:
        with websocket(f"{server.ws_url}/ws/agents/test.chat/help/", origin=origin, timeout=10):
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
    ("origin", "host", "secure", "allowed"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000", False, True),
        ("http://127.0.0.1:8000", "127.0.0.1:8001", False, False),
        ("https://chat.example.com", "chat.example.com:443", True, True),  # the default port, left out of one
        ("http://chat.example.com:80", "chat.example.com", False, True),
        ("https://chat.example.com", "chat.example.com:8443", True, False),
        ("http://CHAT.example.com", "chat.example.com", False, True),
        ("http://not-allowed.example", "not-allowed.example", False, False),  # same, but not in ALLOWED_HOSTS
        ("https://app.partner.example", "chat.example.com", True, True),  # a trusted origin
        ("ftp://chat.example.com", "chat.example.com", False, False),
        ("null", "chat.example.com", False, False),
        ("http://[::1]:8000", "[::1]:8000", False, True),
        ("", "chat.example.com", False, False),
        ("http://chat.example.com", None, False, False),
        # the scheme too: a plain-http page on the same host may not open the secure socket
        ("http://chat.example.com", "chat.example.com", True, False),
        ("https://chat.example.com", "chat.example.com", False, False),
    ],
)
def test_what_counts_as_the_same_origin(
    settings: Any, origin: str, host: str | None, secure: bool, allowed: bool
) -> None:
    settings.ALLOWED_HOSTS = ["chat.example.com", "127.0.0.1", "[::1]"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://app.partner.example"]

    assert origin_allowed(origin, host, secure=secure) is allowed


@pytest.mark.parametrize(
    ("proxy", "scheme", "forwarded", "secure"),
    [
        (None, "wss", None, True),
        (None, "ws", None, False),
        (None, "ws", b"https", False),  # no proxy is trusted: its header means nothing
        (("HTTP_X_FORWARDED_PROTO", "https"), "ws", b"https", True),
        (("HTTP_X_FORWARDED_PROTO", "https"), "ws", b"http", False),
        (("HTTP_X_FORWARDED_PROTO", "https"), "ws", b"https, http", True),  # the first, as Django reads it
        (("HTTP_X_FORWARDED_PROTO", "https"), "wss", None, True),
    ],
)
def test_a_socket_is_secure_as_django_reads_a_request(
    settings: Any, proxy: tuple[str, str] | None, scheme: str, forwarded: bytes | None, secure: bool
) -> None:
    settings.SECURE_PROXY_SSL_HEADER = proxy
    headers = {b"x-forwarded-proto": forwarded} if forwarded is not None else {}

    assert is_secure({"type": "websocket", "scheme": scheme}, headers) is secure
