"""What config/server.py changes in daphne's server.

daphne's requests leave a form body to Django: Twisted no longer parses it in the reactor's thread
first. A multipart body Twisted cannot parse shows which of the two read it: Twisted refuses it with
a bare 400 and closes the connection; Django's view answers as it would. And Twisted formats no
access-log line for a log daphne discards."""

from __future__ import annotations

import io

import httpx
import pytest

from tests.support import AsgiServer

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_multipart_body_reaches_django_unparsed_by_twisted(asgi_server: AsgiServer) -> None:
    # given a POST whose body is not the multipart its Content-Type says
    headers = {"Content-Type": "multipart/form-data; boundary=xyz"}

    # when it is sent through daphne to a view that takes no POST
    with httpx.Client(base_url=asgi_server.url, timeout=30) as client:
        response = client.post("/healthz", content=b"not multipart at all", headers=headers)

    # then Django's view answers it (its 405), not Twisted's 400
    assert response.status_code == 405, response.text


def test_twisted_formats_no_access_line_daphne_would_discard() -> None:
    from daphne.http_protocol import HTTPFactory

    import config.asgi  # noqa: F401  # applies config/server.py, as loading the application does

    class Unreadable:
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"the request's {name} was read for a log line")

    factory = HTTPFactory(server=None)
    factory._logFile, factory._logDateTime = io.StringIO(), "02/Dec/2026:00:00:00 +0000"  # as startFactory sets

    factory.log(Unreadable())  # Twisted's own formats a line from the request's method, path, status, ...

    assert factory._logFile.getvalue() == ""
