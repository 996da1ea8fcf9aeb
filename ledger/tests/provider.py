"""A fake payment provider for the ledger's tests: a real HTTP server on 127.0.0.1, in a thread.

Test-only (the demo's sandbox provider lives in examples/). It behaves like a careful real one:

- ``POST /<action>`` with ``Idempotency-Key``: applies the effect once per key and answers 201
  with the stored record; the same key again answers the stored record (200), never a second effect.
- ``GET /<action>/<key>``: 200 with the record, or 404 if the key was never applied.
- No batch lookup, like many providers: a POST to ``/<action>/<anything>`` meets the lookup route,
  which takes GET only (405); a POST to a deeper path meets no route (404). Counted as
  ``batch_lookup`` calls.

Faults are injected per request, per endpoint and key, consumed in order (``inject``):

- ``delay``: sleep, then behave normally.
- ``accept_then_hang``: apply the effect, then sleep past the client's read timeout (no answer).
- ``drop``: read the request, close the connection without applying or answering.
- ``error``: answer a 5xx (``status``) without applying anything.
- ``rate_limit``: answer 429 without applying anything.
- ``reject``: record a declined operation under the key and answer 422.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import unquote

FaultKind = Literal["delay", "accept_then_hang", "drop", "error", "rate_limit", "reject"]
Endpoint = Literal["submit", "lookup", "batch_lookup"]


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    seconds: float = 0.0
    status: int = 503
    reason: str = "card_declined"


@dataclass(frozen=True)
class Call:
    endpoint: Endpoint
    key: str
    fault: str  # the fault applied, or "none"
    idempotency_key: str | None = None
    body: Any = None


@dataclass
class FakeProvider:
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    applied: list[str] = field(default_factory=list)  # one entry per effect applied, in order
    calls: list[Call] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._faults: dict[tuple[str, str], deque[Fault]] = {}
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True  # a handler asleep in accept_then_hang must not block stop()
        self._server.provider = self
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-provider", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # --- what tests set up and read ---
    def inject(self, endpoint: Endpoint, key: str, *faults: Fault) -> None:
        with self._lock:
            self._faults.setdefault((endpoint, key), deque()).extend(faults)

    def seed(self, key: str, *, status: str = "succeeded", action: str = "refund", **fields: Any) -> dict[str, Any]:
        """A record as if the key had been applied earlier (without counting a call)."""
        record = {"id": f"pay_{len(self.records) + 1}", "key": key, "action": action, "status": status, **fields}
        with self._lock:
            self.records[key] = record
        return record

    def submits(self, key: str | None = None) -> int:
        return sum(1 for c in self.calls if c.endpoint == "submit" and (key is None or c.key == key))

    def lookups(self, key: str | None = None) -> int:
        return sum(1 for c in self.calls if c.endpoint == "lookup" and (key is None or c.key == key))

    def batch_lookups(self) -> int:
        return sum(1 for c in self.calls if c.endpoint == "batch_lookup")

    # --- what the handler calls ---
    def next_fault(self, endpoint: Endpoint, key: str) -> Fault | None:
        with self._lock:
            queue = self._faults.get((endpoint, key))
            return queue.popleft() if queue else None

    def log_call(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)

    def apply(
        self, key: str, action: str, request: Any, *, status: str = "succeeded", reason: str | None = None
    ) -> tuple[dict[str, Any], bool]:
        """Store the effect once per key; return (record, newly applied)."""
        with self._lock:
            if key in self.records:
                return self.records[key], False
            record: dict[str, Any] = {
                "id": f"pay_{len(self.records) + 1}",
                "key": key,
                "action": action,
                "status": status,
                "amount": request.get("amount") if isinstance(request, dict) else None,
                # Echoed back, as providers do: the ledger must keep it out of logs and records.
                "customer": request.get("customer") if isinstance(request, dict) else None,
            }
            if reason:
                record["reason"] = reason
            self.records[key] = record
            self.applied.append(key)
            return record, True


class _Server(ThreadingHTTPServer):
    provider: FakeProvider  # the one it serves, set by FakeProvider


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    @property
    def provider(self) -> FakeProvider:
        return self.server.provider

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: pytest shows failures, not every request

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
        segments = self.path.strip("/").split("/")
        if len(segments) > 1:  # not a submit: see the module docstring
            self.provider.log_call(Call("batch_lookup", "", "none", body=body))
            if len(segments) == 2:
                self._answer(405, {"error": {"code": "method_not_allowed"}}, Allow="GET")
            else:
                self._answer(404, {"error": {"code": "no_such_endpoint"}})
            return
        action = unquote(segments[0])
        key = self.headers.get("Idempotency-Key")
        if not key:
            self._answer(400, {"error": {"code": "missing_idempotency_key"}})
            return
        fault = self.provider.next_fault("submit", key)
        self.provider.log_call(Call("submit", key, fault.kind if fault else "none", key, body))
        if fault is not None and fault.kind == "delay":
            time.sleep(fault.seconds)
            fault = None
        if fault is None:
            record, new = self.provider.apply(key, action, body)
            self._answer(201 if new else 200, record)
        elif fault.kind == "accept_then_hang":
            self.provider.apply(key, action, body)
            time.sleep(fault.seconds)  # the client gave up long ago; its answer is lost
            self.close_connection = True
        elif fault.kind == "drop":
            self.close_connection = True  # no status line at all: "server disconnected"
        elif fault.kind == "error":
            self._answer(fault.status, {"error": {"code": "internal", "message": "try again later"}})
        elif fault.kind == "rate_limit":
            self._answer(429, {"error": {"code": "rate_limited"}})
        elif fault.kind == "reject":
            record, _ = self.provider.apply(key, action, body, status="failed", reason=fault.reason)
            self._answer(422, {"error": {"code": fault.reason, "message": "declined"}, "record": record})

    def do_GET(self) -> None:
        parts = self.path.strip("/").split("/")
        key = unquote(parts[-1]) if len(parts) == 2 else ""
        fault = self.provider.next_fault("lookup", key)
        self.provider.log_call(Call("lookup", key, fault.kind if fault else "none"))
        if fault is not None and fault.kind == "delay":
            time.sleep(fault.seconds)
        elif fault is not None and fault.kind == "error":
            self._answer(fault.status, {"error": {"code": "internal"}})
            return
        elif fault is not None and fault.kind == "drop":
            self.close_connection = True
            return
        record = self.provider.records.get(key)
        if record is None:
            self._answer(404, {"error": {"code": "not_found"}})
        else:
            self._answer(200, record)

    def _answer(self, status: int, body: Any, **headers: str) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out and left
