"""Under ASGI the middleware chain runs in one thread per request (config.handlers.ASGIHandler).

Django's own middleware, called in their async form, hand each ``process_request``,
``process_view`` and ``process_response`` to a thread and back: about fifteen thread switches a
request, a third of a trivial request's CPU through daphne on this machine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from asgiref import testing
from asgiref.sync import SyncToAsync
from django.core import signals
from django.http import HttpRequest, StreamingHttpResponse
from django.urls import path

from config.handlers import ASGIHandler

pytestmark = pytest.mark.django_db


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the functions handed from the event loop to a thread, in order."""
    handed: list[str] = []
    original = SyncToAsync.__call__

    async def counting(self: SyncToAsync[Any, Any], *args: Any, **kwargs: Any) -> Any:
        handed.append(getattr(self.func, "__qualname__", repr(self.func)))
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counting)
    yield handed


@pytest.fixture
def finished() -> Iterator[list[object]]:
    """The senders of ``request_finished``, each time a response is closed."""
    sent: list[object] = []

    def receiver(sender: object, **kwargs: Any) -> None:
        sent.append(sender)

    signals.request_finished.connect(receiver)
    yield sent
    signals.request_finished.disconnect(receiver)


communicator_class: Any = testing.ApplicationCommunicator  # asgiref's test driver, untyped


async def next_message(communicator: Any, timeout: float = 10) -> dict[str, Any]:
    """The application's next message, or its exception as soon as it raises: asgiref's
    ``receive_output`` raises it only once its whole timeout has passed."""
    if not communicator.output_queue.empty():
        return dict(communicator.output_queue.get_nowait())
    message = asyncio.ensure_future(communicator.output_queue.get())
    done, _ = await asyncio.wait({message, communicator.future}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    if message in done:
        return dict(message.result())
    message.cancel()
    if communicator.future.done():
        communicator.future.result()  # the application's exception
        raise RuntimeError("the application ended without a message")
    raise TimeoutError(f"no message from the application in {timeout} s")


def request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """The status and body the project's ASGI handler answers, called as daphne calls it."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver")] + [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }

    async def exchange() -> tuple[int, bytes]:
        communicator: Any = communicator_class(ASGIHandler(), scope)
        await communicator.send_input({"type": "http.request", "body": body, "more_body": False})
        start = await next_message(communicator)
        content = b""
        while True:
            message = await next_message(communicator)
            content += message.get("body", b"")
            if not message.get("more_body"):
                break
        await communicator.wait(10)
        return start["status"], content

    return asyncio.run(exchange())


def test_a_request_enters_the_chain_from_the_event_loop_once(hops: list[str], finished: list[object]) -> None:
    status, body = request("GET", "/healthz")

    assert (status, json.loads(body)) == (200, {"status": "ok"})
    # One hop: the request_started receivers, the chain (every middleware, the view middleware and
    # the sync view), and closing the response (request_finished: the database connection goes back)
    # before it is sent. Django's own handler takes 16: each middleware's process_request and
    # process_response, process_view and the view, and the signals, apart.
    assert hops == ["ASGIHandler.respond"], hops
    assert len(finished) == 1


def streamed(request: HttpRequest) -> StreamingHttpResponse:
    async def parts() -> AsyncIterator[bytes]:  # as the SSE streams send theirs
        yield b"one "
        yield b"two"

    return StreamingHttpResponse(parts(), content_type="text/plain")


def broken(request: HttpRequest) -> StreamingHttpResponse:
    async def parts() -> AsyncIterator[bytes]:
        yield b"one "
        raise RuntimeError("the stream's source went away")

    return StreamingHttpResponse(parts(), content_type="text/plain")


urlpatterns = [path("streamed", streamed), path("broken", broken)]


@pytest.mark.urls("tests.test_middleware_chain")
def test_a_streaming_response_is_sent_by_the_loop_then_closed_in_a_second_hop(
    hops: list[str], finished: list[object]
) -> None:
    status, body = request("GET", "/streamed")

    assert (status, body) == (200, b"one two")
    assert hops[0] == "ASGIHandler.respond" and len(hops) == 2, hops
    assert len(finished) == 1  # closed once, after the last part was sent


def test_a_refusal_is_answered_and_logged_as_django_does(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="django.request"):
        status, body = request("GET", "/api/no-such-thing")

    assert status == 404 and json.loads(body)["error"]["code"] == "not_found"
    assert any(r.name == "django.request" and r.levelname == "WARNING" for r in caplog.records)


@pytest.mark.urls("tests.test_middleware_chain")
def test_a_stream_whose_source_fails_is_closed_all_the_same(finished: list[object]) -> None:
    with pytest.raises(RuntimeError, match="went away"):
        request("GET", "/broken")
    assert len(finished) == 1
