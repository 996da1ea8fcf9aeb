"""``SameOriginValidator``: a WebSocket is opened only from this site's own pages.

A browser sends its cookies with a WebSocket handshake from any page, so the server must check the
``Origin`` the browser puts on it (there is no CSRF token on a socket). channels'
``AllowedHostsOriginValidator`` compares the Origin's host name with ALLOWED_HOSTS and ignores the
port: a page served by another service on the same host (``http://127.0.0.1:9000``, a dev tool, a
local app) could open the chat socket as the signed-in user. Here the Origin must be the very
host and port the browser connected to (its ``Host`` header, which must itself be one of
ALLOWED_HOSTS) in the connection's own scheme (an ``https`` page for a ``wss`` socket, as Django
reads it for a request: SECURE_PROXY_SSL_HEADER behind a proxy that terminates TLS), as Django's
CSRF check requires of a form post, or one of CSRF_TRUSTED_ORIGINS (a front end served from another
origin). A plain-http page on the same host (an attacker on the network, before HSTS holds) may not
open the secure socket with the user's cookies. A handshake without an Origin (not a browser) is
refused too, as channels' validator refuses it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": "80", "https": "443"}


def _netloc(scheme: str, host: str) -> str:
    """``host[:port]`` lower-cased, without the scheme's default port (browsers leave it out of one
    header or the other)."""
    host = host.lower()
    domain, port = split_domain_port(host)
    if port and port == DEFAULT_PORTS.get(scheme):
        return domain
    return host


def origin_allowed(origin: str | None, host: str | None, *, secure: bool) -> bool:
    """Whether a handshake from ``origin`` may open a socket on ``host`` (its Host header), over a
    connection that is ``secure`` (wss, or https at the proxy)."""
    if not origin or not host:
        return False
    if origin.rstrip("/").lower() in {o.rstrip("/").lower() for o in settings.CSRF_TRUSTED_ORIGINS}:
        return True
    try:
        parsed = urlsplit(origin)
    except ValueError:
        return False
    if parsed.scheme != ("https" if secure else "http") or not parsed.netloc:
        return False
    allowed_hosts = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed_hosts:
        allowed_hosts = [".localhost", "127.0.0.1", "[::1]"]  # Django's own default under DEBUG
    domain, _ = split_domain_port(host.lower())
    if not domain or not validate_host(domain, allowed_hosts):
        return False
    return _netloc(parsed.scheme, parsed.netloc) == _netloc(parsed.scheme, host)


def is_secure(scope: dict[str, Any], headers: dict[bytes, bytes]) -> bool:
    """Whether the handshake came over TLS, as Django's ``request.is_secure()`` would say: the
    proxy's header (SECURE_PROXY_SSL_HEADER) when set and sent, else the socket's own scheme."""
    proxy_header = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy_header:
        name, value = (str(part) for part in proxy_header)
        sent = headers.get(name.removeprefix("HTTP_").lower().replace("_", "-").encode("latin-1"))
        if sent is not None:
            return sent.decode("latin-1").split(",", 1)[0].strip() == value
    return scope.get("scheme") == "wss"


class SameOriginValidator:
    """ASGI middleware: a WebSocket handshake from another origin is refused (403) before any
    consumer sees it; HTTP passes through."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket":
            headers = {name.lower(): value for name, value in scope.get("headers", [])}
            origin, host = headers.get(b"origin"), headers.get(b"host")
            if not origin_allowed(
                origin.decode("latin-1") if origin is not None else None,
                host.decode("latin-1") if host is not None else None,
                secure=is_secure(scope, headers),
            ):
                return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
