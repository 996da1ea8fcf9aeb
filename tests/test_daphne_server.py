"""What config/server.py changes in daphne's server.

A body over HTTP_MAX_BODY_BYTES is refused by the server, before it is read: a declared one as soon
as its headers are in, a chunked one once it passes the limit. daphne's requests leave a form body
to Django: Twisted no longer parses it in the reactor's thread first. A multipart body Twisted
cannot parse shows which of the two read it: Twisted refuses it with a bare 400 and closes the
connection; Django's view answers as it would. And Twisted formats no access-log line for a log
daphne discards. A body sent chunked (no ``Content-Length``) reaches the API whole
(config/handlers.py), as one with a length does."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from rest_framework.authtoken.models import Token

from agents.models import Submission
from agents.tests.support import chat_agent
from tests.factories import Users
from tests.support import ROOT, AsgiServer, service_env, serving
from webhooks.models import WebhookDelivery
from webhooks.tests.support import SOURCES
from workflows.models import WorkflowRun

LIMIT = 64 * 1024

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


@pytest.fixture(scope="module")
def limited(django_db_setup: None, django_db_blocker: object) -> Iterator[AsgiServer]:
    env = {"HTTP_MAX_BODY_BYTES": str(LIMIT), "WEBHOOK_SOURCES_JSON": json.dumps(SOURCES)}
    with serving(django_db_blocker, **env) as process:
        yield process


def answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    sock.settimeout(10)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_a_body_declared_over_the_limit_is_refused_before_it_is_sent(limited: AsgiServer) -> None:
    # given a webhook whose headers declare a gigabyte, and not a byte of its body sent
    with socket.create_connection(("127.0.0.1", limited.port)) as sock:
        sock.sendall(
            b"POST /webhooks/runs/ HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000000\r\n\r\n"
        )

        # then the server answers 413 in the API's error shape at once, and closes the connection
        head, _, body = answer(sock).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 ") and b"Connection: close" in head
    assert json.loads(body)["error"]["code"] == "payload_too_large"
    assert WebhookDelivery.objects.count() == 0  # the view never ran: nothing was read to record


def test_a_chunked_body_is_refused_once_it_passes_the_limit(limited: AsgiServer) -> None:
    # given a body of undeclared length that goes on past the limit
    chunk = b"x" * 8192
    with socket.create_connection(("127.0.0.1", limited.port)) as sock:
        sock.sendall(b"POST /webhooks/runs/ HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            for _ in range(4 * LIMIT // len(chunk)):
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass  # the server closed the connection while it was being sent: what the test expects
        received = answer(sock)

    assert received.startswith(b"HTTP/1.1 413 "), received[:200]
    assert WebhookDelivery.objects.count() == 0


def test_a_body_within_the_limit_reaches_the_view(limited: AsgiServer) -> None:
    # given an unsigned delivery under the server's limit but over its source's (4,096 bytes)
    with httpx.Client(base_url=limited.url, timeout=30) as client:
        response = client.post("/webhooks/runs/", content=b"{}" + b" " * 10_000)

    # then the webhook's view refuses it, and records the refusal (naming no record to an unsigned sender)
    assert response.status_code == 413
    [delivery] = WebhookDelivery.objects.all()
    assert response.json()["error"]["detail"] == {"delivery": None}
    assert delivery.reason == "payload_too_large"


def chunked(body: bytes) -> Iterator[bytes]:
    """A body httpx sends chunked (``Transfer-Encoding: chunked``, no ``Content-Length``)."""
    yield body[:7]
    yield body[7:]


def test_a_chunked_body_reaches_the_api_whole(asgi_server: AsgiServer, users: Users) -> None:
    # given another system's token, an agent, and bodies it sends chunked
    chat_agent(users.alice)
    token = Token.objects.create(user=users.alice).key
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    start = json.dumps({"payload": {"n": 7}}).encode()
    said = json.dumps({"messages": [{"role": "user", "content": "sent chunked"}], "metadata": {"m": 1}}).encode()

    # when it starts a run and makes a submission with them, then retries the start with a length
    with httpx.Client(base_url=asgi_server.url, headers=headers, timeout=30) as client:
        key = {"Idempotency-Key": "chunked-start"}
        first = client.post("/api/workflows/test.echo/runs", content=chunked(start), headers=key)
        retry = client.post("/api/workflows/test.echo/runs", content=start, headers=key)
        submitted = client.post(
            "/api/agents/test.chat/t/submissions", content=chunked(said), headers={"Idempotency-Key": "chunked-said"}
        )

    # then the run has the payload sent, the retry is the same run (not a 409 for another payload),
    # and the submission holds its messages: nothing was read as {}
    assert first.status_code == 201, first.text
    assert retry.status_code == 200 and retry.json()["id"] == first.json()["id"], retry.text
    assert WorkflowRun.objects.get(pk=first.json()["id"]).payload == {"n": 7}
    assert submitted.status_code == 202, submitted.text
    submission = Submission.objects.get(pk=submitted.json()["id"])
    assert (submission.messages, submission.metadata) == ([{"role": "user", "content": "sent chunked"}], {"m": 1})
