"""What config/server.py changes in daphne's server.

daphne's requests leave a form body to Django: Twisted no longer parses it in the reactor's thread
first. A multipart body Twisted cannot parse shows which of the two read it: Twisted refuses it with
a bare 400 and closes the connection; Django's view answers as it would. And Twisted formats no
access-log line for a log daphne discards."""

from __future__ import annotations

import io
import subprocess
import sys

import httpx
import pytest

from tests.support import ROOT, AsgiServer, service_env

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_multipart_body_reaches_django_unparsed_by_twisted(asgi_server: AsgiServer) -> None:
    # given a POST whose body is not the multipart its Content-Type says
    headers = {"Content-Type": "multipart/form-data; boundary=xyz"}

    # when it is sent through daphne to a view that takes no POST
    with httpx.Client(base_url=asgi_server.url, timeout=30) as client:
        response = client.post("/healthz", content=b"not multipart at all", headers=headers)

    # then Django's view answers it (its 405), not Twisted's 400
    assert response.status_code == 405, response.text


def test_twisted_formats_no_access_line_daphne_would_discard(monkeypatch: pytest.MonkeyPatch) -> None:
    from daphne.http_protocol import HTTPFactory

    from config.server import drop_twisted_access_log

    monkeypatch.setattr(HTTPFactory, "log", HTTPFactory.log)  # put back after the test
    drop_twisted_access_log()  # as config/asgi.py does when the application loads

    class Unreadable:
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"the request's {name} was read for a log line")

    factory = HTTPFactory(server=None)
    factory._logFile, factory._logDateTime = io.StringIO(), "02/Dec/2026:00:00:00 +0000"  # as startFactory sets

    factory.log(Unreadable())  # Twisted's own formats a line from the request's method, path, status, ...

    assert factory._logFile.getvalue() == ""


def test_loading_the_application_drops_twisteds_access_log() -> None:
    # In a process of its own: loading config.asgi changes this one's environment and collector.
    code = "import config.asgi; from daphne.http_protocol import HTTPFactory; print(HTTPFactory.log.__qualname__)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=service_env(), cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "drop_twisted_access_log.<locals>.log"
