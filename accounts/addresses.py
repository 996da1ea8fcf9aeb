"""What the limits that count by client share (failed sign-ins, ``accounts.signin``; recorded webhook
rejections, ``webhooks.rejections``): the address a request came from, the Redis client their
scripts count with, and how they say that Redis cannot be reached.

Behind proxies every request comes from the nearest one's address: CLIENT_ADDRESS_HEADER names the
header they put the client's address in, CLIENT_ADDRESS_PROXIES how many of them append to it. An
IPv6 address counts by its /64, the block one machine is usually given.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import time
from typing import Any

import redis
from django.conf import settings
from django.http import HttpRequest


def _parsed(entry: str) -> str:
    """An address as a proxy may write it: ``192.0.2.1``, ``192.0.2.1:5555``, ``[2001:db8::1]``,
    ``[2001:db8::1]:443`` or ``2001:db8::1``; anything else as it is."""
    entry = entry.strip()
    if entry.startswith("[") and "]" in entry:
        return entry[1 : entry.index("]")]
    if entry.count(":") == 1:
        return entry.split(":", 1)[0]
    return entry


def client_address(request: HttpRequest) -> str:
    """The address a request came from: in CLIENT_ADDRESS_HEADER when that is set, the one the
    farthest of CLIENT_ADDRESS_PROXIES proxies added (those before it the client may have written
    itself), else the connection's. An IPv6 address as its /64."""
    address = str(request.META.get("REMOTE_ADDR") or "")
    header = settings.CLIENT_ADDRESS_HEADER
    if header:
        forwarded = [part.strip() for part in request.headers.get(header, "").split(",") if part.strip()]
        if forwarded:
            address = forwarded[-min(len(forwarded), max(1, int(settings.CLIENT_ADDRESS_PROXIES)))]
    address = _parsed(address)
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address[:64]  # not an address (a test client's, a misconfigured header's): counted as it is
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{parsed}/64", strict=False))
    return str(parsed)


# The process's Redis client for the limits, and the scripts registered on it (a forked process
# makes its own).
_limits: tuple[int, redis.Redis, dict[str, Any]] | None = None


def limit_script(text: str) -> Any:
    """The Lua script ``text``, registered on the process's client for the limits: short timeouts,
    since a request must not hang on Redis (one that fails says so through ``redis_down``)."""
    global _limits
    if _limits is None or _limits[0] != os.getpid():
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        _limits = (os.getpid(), client, {})
    _, client, scripts = _limits
    if text not in scripts:
        scripts[text] = client.register_script(text)
    return scripts[text]


# When each limit last said Redis was down, in this process (time.monotonic()).
_said: dict[str, float] = {}
REDIS_DOWN_EVERY_SECONDS = 60.0


def redis_down(logger: logging.Logger, what: str, error: redis.RedisError) -> None:
    """Log that ``what`` could not count (Redis), at most once a minute a process: the requests that
    fail so are anyone's to send (forged webhooks, guessed passwords), and a line with a traceback
    for each would let them fill the log for as long as Redis is down."""
    now = time.monotonic()
    if now - _said.get(what, -REDIS_DOWN_EVERY_SECONDS) < REDIS_DOWN_EVERY_SECONDS:
        return
    _said[what] = now
    logger.error(
        "%s: Redis cannot be reached (%s: %s); said at most once a minute while it lasts",
        what,
        type(error).__name__,
        error,
        extra={"event": "limits.redis_down"},
    )
