"""What the project changes in daphne's HTTP server, applied when the ASGI application loads.

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
