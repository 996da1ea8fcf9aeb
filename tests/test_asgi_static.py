"""Static files as the ASGI app serves them (``SERVE_STATIC``), against a real daphne.

Paths are sent as raw bytes with http.client: clients such as httpx normalise ``..`` away.
"""

from __future__ import annotations

import http.client
from pathlib import Path

import pytest

from tests.support import AsgiServer

pytestmark = pytest.mark.django_db(transaction=True)

OUTSIDE = [
    "/static/../config/settings.py",
    "/static/%2e%2e/config/settings.py",
    "/static/%2E%2E/config/settings.py",
    "/static/..%2fconfig%2fsettings.py",
    "/static/%2e%2e%2fconfig%2fsettings.py",
    "/static/admin/../../config/settings.py",
    "/static/admin/css/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "/static/..",
    "/static/%2e%2e",
]


def get(server: AsgiServer, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.putrequest("GET", path, skip_accept_encoding=True)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_a_path_out_of_the_static_folders_is_a_404_without_an_error(asgi_server: AsgiServer) -> None:
    # given the server's log so far
    log = Path(asgi_server.log.name)
    start = log.stat().st_size

    # when paths that climb out of the static folders are asked for, without signing in
    answers = {path: get(asgi_server, path) for path in OUTSIDE}

    # then each is a plain 404 that shows nothing of the file, and nothing is logged as an error
    assert {path: status for path, (status, _) in answers.items()} == {path: 404 for path in OUTSIDE}
    assert not any(b"SECRET_KEY" in body or b"root:" in body for _, body in answers.values())
    with log.open("rb") as lines:
        lines.seek(start)
        written = lines.read().decode(errors="replace")
    assert "Traceback" not in written and "SuspiciousFileOperation" not in written and " 500 " not in written, written
    # and a static file inside them is still served
    status, body = get(asgi_server, "/static/admin/css/base.css")
    assert status == 200 and body
