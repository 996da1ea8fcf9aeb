"""A small OpenAI-compatible server for the provider tests, scripted reply by reply.

It answers ``POST /v1/chat/completions`` the way a streaming server does (server-sent events in
chunked transfer encoding, ``data: [DONE]`` at the end) and has a switch for each way real
servers differ or fail: tool-call deltas without an index or an id, parallel calls sharing index
0, arguments sent one character per chunk, malformed arguments (any text), a socket closed
mid-stream, a stream that just stops, an HTTP error status, a slow server and one that waits for
the test before it goes on. Each request takes the next scripted ``Reply``, and is kept in
``requests`` for the test to check.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

GATED_AT = 2  # a gated reply waits before its third event: the role chunk and the first word are out
GATE_TIMEOUT = 5.0  # a gated reply goes on by itself after this long (a test that never opens the gate)


@dataclass(frozen=True)
class FakeCall:
    """A tool call the fake model makes; ``arguments`` is sent as it is, valid JSON or not."""

    name: str
    arguments: str
    id: str = ""  # "" makes one up: call_<position>


@dataclass(frozen=True)
class Reply:
    """One scripted answer and the quirks to send it with."""

    text: str = ""  # streamed a word a chunk
    calls: tuple[FakeCall, ...] = ()
    finish_reason: str = ""  # "" sends "tool_calls" after calls, else "stop"
    status: int = 200  # anything else answers with that status and a JSON error instead of a stream
    missing_index: bool = False  # tool-call deltas carry no "index"
    missing_id: bool = False  # tool-call deltas carry no "id"
    shared_index: bool = False  # every call is at index 0
    split_arguments: bool = False  # arguments one character a chunk
    send_finish: bool = True  # a last chunk with the finish_reason
    send_done: bool = True  # data: [DONE]
    die_after: int | None = None  # close the socket (mid-body) after this many events
    delay: float = 0.0  # seconds before each event
    gate: threading.Event | None = None  # after the role chunk and the first word, wait for the test to set it
    raw: tuple[str, ...] = ()  # send these data payloads instead of the generated chunks


@dataclass
class FakeOpenAI:
    """The server: start it (or use ``with``), ``script`` its replies, read ``requests``."""

    replies: list[Reply] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    gate_timed_out: bool = False
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None, "start the server first"
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def start(self) -> FakeOpenAI:
        fake = self

        class Handler(_Handler):
            server_fake = fake

        self.server = server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        # stop() waits up to one poll interval, and every test stops a server: poll often.
        serve = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        serve.start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def next_reply(self) -> Reply | None:
        return self.replies.pop(0) if self.replies else None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # chunked bodies, so a socket closed mid-body is a broken stream
    server_fake: FakeOpenAI

    def log_message(self, format: str, *args: Any) -> None:  # quiet in the test output
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):  # the client went away (a timeout, a closed stream)
            self.close_connection = True

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        fake = self.server_fake
        fake.requests.append(json.loads(body or b"{}"))
        fake.headers.append({key.lower(): value for key, value in self.headers.items()})
        reply = fake.next_reply()
        if self.path != "/v1/chat/completions" or reply is None:
            self.send_json(404 if reply else 500, {"error": {"message": "nothing scripted for this request"}})
            return
        if reply.status != 200:
            self.send_json(reply.status, {"error": {"message": f"scripted status {reply.status}"}})
            return
        self.send_stream(reply)

    def send_json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_stream(self, reply: Reply) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for sent, payload in enumerate(events(reply)):
            if reply.die_after is not None and sent >= reply.die_after:
                self.die()
                return
            if sent == GATED_AT and reply.gate is not None and not reply.gate.wait(GATE_TIMEOUT):
                self.server_fake.gate_timed_out = True
            if reply.delay:
                time.sleep(reply.delay)
            self.write_chunk(f"data: {payload}\n\n".encode())
        self.write_chunk(b"")  # the last chunk: the body is complete

    def write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def die(self) -> None:
        """Close the socket mid-body, as a crashed server or a cut connection does."""
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)


def events(reply: Reply) -> list[str]:
    """The data payloads of a reply, in order."""
    if reply.raw:
        return list(reply.raw)
    chunks: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    chunks += [{"content": word} for word in words(reply.text)]
    for position, call in enumerate(reply.calls):
        chunks += call_deltas(reply, position, call)
    payloads = [json.dumps(chunk_of(delta)) for delta in chunks]
    if reply.send_finish:
        reason = reply.finish_reason or ("tool_calls" if reply.calls else "stop")
        payloads.append(json.dumps(chunk_of({}, finish_reason=reason)))
    if reply.send_done:
        payloads.append("[DONE]")
    return payloads


def call_deltas(reply: Reply, position: int, call: FakeCall) -> list[dict[str, Any]]:
    """A call as a server streams it: the id and name first, then the arguments in pieces."""
    pieces = list(call.arguments) if reply.split_arguments else [call.arguments]
    head: dict[str, Any] = {"type": "function", "function": {"name": call.name, "arguments": ""}}
    if not reply.missing_id:
        head["id"] = call.id or f"call_{position}"
    deltas = [head] + [{"function": {"arguments": piece}} for piece in pieces]
    if not reply.missing_index:
        for delta in deltas:
            delta["index"] = 0 if reply.shared_index else position
    return [{"tool_calls": [delta]} for delta in deltas]


def chunk_of(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "model": "fake",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def words(text: str) -> list[str]:
    pieces = text.split(" ")
    return [piece + " " for piece in pieces[:-1]] + [pieces[-1]] if text else []
