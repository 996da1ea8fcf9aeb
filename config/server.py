"""What the project changes in daphne's HTTP server, applied when the ASGI application loads.

A limit on a request's body (``limit_request_bodies``). Twisted receives a request's whole body
before daphne starts the application, and daphne then hands all of it to the application at once,
in memory: without a limit of the server's own, a client could send a gigabyte to any path (a
webhook's 413 came only once all of it had arrived, and daphne's memory stayed grown after). A body
declared larger than HTTP_MAX_BODY_BYTES is answered 413 as soon as its headers are in, without
reading it, and a chunked one once it passes the limit; the connection is closed (what the client
is still sending is not read).

Two things Twisted does for every request that daphne never uses.

Twisted's ``http.Request`` parses the body of every POST whose Content-Type is a form
(``application/x-www-form-urlencoded`` or ``multipart/form-data``) into ``request.args``, and to
find out it parses every POST's Content-Type with the ``email`` package. daphne never reads
``args``: it hands the raw body to the ASGI application, which parses it again (Django, DRF). So
that parse only costs: about 6% of a daphne's CPU on signed webhooks (JSON POSTs), and for a
multipart body of any size, sent to any path, the whole of it parsed by the ``email`` package in
the reactor's thread, which serves every other connection of the process meanwhile (and a body it
cannot parse is refused with Twisted's bare 400 before Django sees it). Turned off per request,
which Twisted supports (``Request(parsePOSTFormSubmission=False)``; daphne creates its requests
without a way to pass it).

Twisted's ``HTTPFactory`` also formats an access-log line (the combined log format) for every
request it finishes and writes it to Twisted's log, which daphne sends nowhere below verbosity 2
(``Server.run`` observes the log with a function that drops everything), and at 2 and above would
repeat daphne's own access log (``--access-log``, ``AccessLogGenerator``, which stays as it is):
about 4% of a daphne's event loop under ``GET /healthz``.
"""

from __future__ import annotations

import json
from typing import Any


def leave_form_bodies_to_django() -> None:
    try:
        from daphne.http_protocol import WebRequest
    except ImportError:  # served by another ASGI server
        return
    if getattr(WebRequest, "forms_left_to_django", False):
        return
    init = WebRequest.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._parsePOSTFormSubmission = False  # read by Twisted's requestReceived, later

    WebRequest.__init__ = __init__
    WebRequest.forms_left_to_django = True


def drop_twisted_access_log() -> None:
    try:
        from daphne.http_protocol import HTTPFactory
    except ImportError:  # served by another ASGI server
        return

    def log(self: Any, request: Any) -> None:
        """Nothing: Twisted's line would go to a log daphne discards (its own access log is apart)."""

    HTTPFactory.log = log


def too_large_response(limit: int) -> bytes:
    """The whole HTTP response refusing a body over ``limit`` bytes: the API's error shape, and the
    connection closed (the rest of the body is not read)."""
    from workflows.apis.errors import error_body

    message = f"the request's body is larger than {limit:,} bytes (HTTP_MAX_BODY_BYTES)"
    body = json.dumps(error_body("payload_too_large", message)).encode()
    head = (
        "HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def limit_request_bodies(limit: int) -> None:
    """Refuse a request body over ``limit`` bytes in the server, before it is read (declared
    Content-Length) or once it passes the limit (chunked)."""
    try:
        from daphne.http_protocol import WebRequest
    except ImportError:  # served by another ASGI server
        return
    if getattr(WebRequest, "body_limit", None) is not None:
        WebRequest.body_limit = limit
        return
    got_length, handle_chunk = WebRequest.gotLength, WebRequest.handleContentChunk

    def refuse(self: Any) -> None:
        self.body_refused = True
        channel = self.channel
        if channel is not None and channel.transport is not None:
            channel.transport.write(too_large_response(self.body_limit))
            channel.transport.loseConnection()

    def gotLength(self: Any, length: int | None) -> None:  # noqa: N802  # Twisted's name
        self.body_room = self.body_limit
        too_large = length is not None and length > self.body_limit
        got_length(self, None if too_large else length)
        if too_large:
            refuse(self)

    def handleContentChunk(self: Any, data: bytes) -> None:  # noqa: N802  # Twisted's name
        if self.body_refused:
            return
        self.body_room -= len(data)
        if self.body_room < 0:
            refuse(self)
            return
        handle_chunk(self, data)

    WebRequest.body_limit = limit
    WebRequest.body_refused = False
    WebRequest.gotLength = gotLength
    WebRequest.handleContentChunk = handleContentChunk
