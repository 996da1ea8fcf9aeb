"""The sandbox payment provider's HTTP API (standard library only; it stands for another company's
service, so it imports nothing from this project's Django code).

    POST /v1/refunds            Idempotency-Key: <key>   {"order", "amount", "currency"}
    GET  /v1/refunds?key=<key>  the refund made under that key, or 404
    POST /v1/refunds/lookup     {"keys": [...]}: {"found": {key: refund}, "missing": [key]}
    GET  /v1/refunds            every refund (inspection)
    GET  /v1/webhooks           the outbox: every outcome event, its status and attempts
    GET  /v1/stats              {"refunds": n, "requests": {outcome: n}, "faults": {...}, ...}
    POST /v1/faults             arm a fault for the next request(s) on a key, or its webhook
    GET  /v1/faults             the faults still armed
    POST /v1/reset              forget everything (sandbox only)

Faults: see ``faults.py``. A request's ``X-Sandbox-Fault`` header takes precedence over a fault
armed for its key; an armed fault is used up only by a request that carries no header. Faults
act only on well-formed requests: a request answered 400/422 consumes no armed fault.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from examples.sandbox.faults import LOOKUP_KINDS, Fault, FaultError, WebhookFault, parse_fault, parse_webhook_fault
from examples.sandbox.store import Store, Target

MAX_BODY_BYTES = 64 * 1024
MAX_KEY_LENGTH = 255
MAX_TIMES = 1000
FIELDS = ("order", "amount", "currency", "reason", "metadata")
AMOUNT_RE = re.compile(r"(?:0|[1-9][0-9]{0,11})(?:\.[0-9]{1,2})?")
CURRENCY_RE = re.compile(r"[A-Z]{3}")
KEY_RE = re.compile(rf"[\x21-\x7e]{{1,{MAX_KEY_LENGTH}}}")  # printable ASCII, no spaces

log_lock = threading.Lock()


@dataclass(frozen=True)
class Config:
    timeout_seconds: float = 30.0  # how long the ``timeout`` fault sleeps unless told
    decline_above: Decimal = Decimal("10000")  # larger amounts are declined (402)
    settle_after: float | None = None  # refunds are "pending" this long, then settle (None: at once)
    webhook_faults: tuple[str, ...] | None = None  # None: no webhooks; else the faults every event suffers


@dataclass
class Reply:
    status: int
    body: Any
    outcome: str
    headers: dict[str, str] = field(default_factory=dict)


class BadRequest(Exception):
    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.reply = Reply(status, {"error": error, "message": message}, "bad_request" if status == 400 else "invalid")


def validate_refund(data: Any, default_currency: str = "GBP") -> dict[str, Any]:
    """The request body, checked and normalised (amount to two places, currency defaulted);
    raises BadRequest (422) naming the first problem."""

    def invalid(message: str) -> BadRequest:
        return BadRequest(422, "invalid_request", message)

    if not isinstance(data, dict):
        raise invalid("the body must be a JSON object")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise invalid(f"unknown field(s): {', '.join(unknown)}")
    order = data.get("order")
    if not isinstance(order, str) or not order.strip() or len(order) > 200:
        raise invalid("order must be a non-empty string of at most 200 characters")
    amount = data.get("amount")
    if not isinstance(amount, str) or not AMOUNT_RE.fullmatch(amount) or Decimal(amount) <= 0:
        raise invalid('amount must be a positive decimal string with at most 2 decimal places, e.g. "120.00"')
    currency = data.get("currency", default_currency)
    if not isinstance(currency, str) or not CURRENCY_RE.fullmatch(currency):
        raise invalid('currency must be a three-letter upper-case code, e.g. "GBP"')
    reason = data.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > 500):
        raise invalid("reason must be a string of at most 500 characters")
    metadata = data.get("metadata", {})
    if (
        not isinstance(metadata, dict)
        or len(metadata) > 20
        or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 40 and len(v) <= 500 for k, v in metadata.items()
        )
    ):
        raise invalid("metadata must be an object of at most 20 string values")
    return {
        "order": order,
        "amount": f"{Decimal(amount):.2f}",
        "currency": currency,
        "reason": reason,
        "metadata": metadata,
    }


def check_key(key: str | None, where: str) -> str:
    if key is None or key == "":
        raise BadRequest(400, "missing_idempotency_key", f"{where} is required")
    if not KEY_RE.fullmatch(key):
        raise BadRequest(
            400,
            "invalid_idempotency_key",
            f"{where} must be 1 to {MAX_KEY_LENGTH} printable ASCII characters without spaces",
        )
    return key


class SandboxServer(ThreadingHTTPServer):
    daemon_threads = True  # a thread sleeping out a ``timeout`` fault never holds up shutdown

    def __init__(self, address: tuple[str, int], store: Store, config: Config) -> None:
        super().__init__(address, Handler)
        self.store = store
        self.config = config


MAX_BATCH = 1000


class Handler(BaseHTTPRequestHandler):
    # Headers and body leave in separate writes; with Nagle's algorithm on, the body would wait for
    # the client's delayed acknowledgement (about 40 ms an answer).
    disable_nagle_algorithm = True
    protocol_version = "HTTP/1.1"  # keep-alive, as HTTP client libraries expect
    server: SandboxServer
    server_version = "SandboxProvider/1"

    # -- plumbing ---------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # one line per request is written by _log instead

    def _handle(self, method: str) -> None:
        started = time.monotonic()
        self._key: str | None = None
        self._fault: Fault | WebhookFault | None = None
        url = urlsplit(self.path)
        try:
            body = self._read_body()
            reply = self._route(method, url.path, parse_qs(url.query), body)
        except BadRequest as exc:
            reply = exc.reply
            if url.path.rstrip("/") == "/v1/refunds":
                self.server.store.count(reply.outcome)
        except Exception:  # a bug in the sandbox: say so, keep serving
            traceback.print_exc(file=sys.stderr)
            reply = Reply(500, {"error": "internal_error", "message": "sandbox bug; see its stderr"}, "bug")
        # Logged before the reply goes out, so a client that has its answer can read the line.
        self._log(method, url.path, reply, started)
        self._send(reply)

    def _read_body(self) -> bytes:
        length_header = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            raise BadRequest(411, "length_required", "send a Content-Length, not a chunked body")
        if length_header is None:
            return b""
        try:
            length = int(length_header)
        except ValueError:
            self.close_connection = True
            raise BadRequest(400, "bad_request", "Content-Length is not a number") from None
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            raise BadRequest(413, "too_large", f"the body may be at most {MAX_BODY_BYTES} bytes")
        return self.rfile.read(length)

    def _send(self, reply: Reply) -> None:
        data = json.dumps(reply.body).encode()
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:  # the client gave up (a ``timeout`` fault does that on purpose)
            self.close_connection = True

    def _log(self, method: str, path: str, reply: Reply, started: float) -> None:
        # No bodies: order, amount and anything else the client sent stay out of the log.
        elapsed_ms = (time.monotonic() - started) * 1000
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        line = (
            f"{now} {method} {path} key={self._key or '-'} fault={self._fault or '-'} "
            f"status={reply.status} outcome={reply.outcome} {elapsed_ms:.0f}ms\n"
        )
        with log_lock:
            sys.stdout.write(line)
            sys.stdout.flush()

    def _json(self, body: bytes) -> Any:
        try:
            return json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise BadRequest(400, "invalid_json", "the body must be JSON (UTF-8)") from None

    def _header_fault(self, lookup: bool) -> Fault | None:
        text = self.headers.get("X-Sandbox-Fault")
        if text is None or not text.strip():
            return None
        try:
            fault = parse_fault(text)
        except FaultError as exc:
            raise BadRequest(400, "invalid_fault", str(exc)) from None
        if lookup and fault.kind not in LOOKUP_KINDS:
            raise BadRequest(400, "invalid_fault", f"fault {fault.kind!r} does not apply to a lookup")
        return fault

    def _armed_fault(self, key: str, target: Target) -> Fault | None:
        text = self.server.store.take_armed(key, target)
        return None if text is None else parse_fault(text)  # checked when it was armed

    def _sleep(self, fault: Fault) -> None:
        time.sleep(fault.seconds if fault.seconds is not None else self.server.config.timeout_seconds)

    # -- routes -----------------------------------------------------------------------------

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> Reply:
        routes: dict[str, dict[str, Callable[[], Reply]]] = {
            "/v1/refunds": {"POST": lambda: self._create(body), "GET": lambda: self._refunds(query)},
            "/v1/refunds/lookup": {"POST": lambda: self._lookup_many(body)},
            "/v1/webhooks": {"GET": self._webhooks},
            "/v1/stats": {"GET": lambda: Reply(200, self.server.store.stats(), "stats")},
            "/v1/faults": {"POST": lambda: self._arm(body), "GET": self._list_faults},
            "/v1/reset": {"POST": self._reset},
        }
        by_method = routes.get(path.rstrip("/") or "/")
        if by_method is None:
            return Reply(404, {"error": "no_such_endpoint", "message": f"no endpoint {path}"}, "no_endpoint")
        action = by_method.get(method)
        if action is None:
            allowed = ", ".join(sorted(by_method))
            return Reply(
                405, {"error": "method_not_allowed", "message": f"use {allowed}"}, "bad_method", {"Allow": allowed}
            )
        return action()

    def _create(self, body: bytes) -> Reply:
        store, config = self.server.store, self.server.config
        self._key = key = check_key(self.headers.get("Idempotency-Key"), "the Idempotency-Key header")
        header_fault = self._header_fault(lookup=False)
        request = validate_refund(self._json(body))
        fault = self._fault = header_fault or self._armed_fault(key, "create")

        # Faults before anything is done.
        if fault is not None and fault.kind == "delay":
            self._sleep(fault)
        elif fault is not None and fault.kind == "error":
            reply = Reply(500, {"error": "internal_error", "message": "sandbox fault: nothing was done"}, "error")
            store.count(reply.outcome, fault.kind)
            return reply
        elif fault is not None and fault.kind == "reject":
            reply = Reply(402, {"error": "declined", "message": "sandbox fault: refund declined"}, "declined")
            store.count(reply.outcome, fault.kind)
            return reply

        allowed = Decimal(request["amount"]) <= config.decline_above
        outcome, refund = store.create_refund(
            key, request, allowed=allowed, settle_after=config.settle_after, webhook_faults=config.webhook_faults
        )
        if outcome == "created":
            reply = Reply(201, refund, outcome)
        elif outcome == "replayed":
            reply = Reply(200, refund, outcome, {"Idempotent-Replayed": "true"})
        elif outcome == "conflict":
            reply = Reply(
                409,
                {"error": "idempotency_conflict", "message": "this Idempotency-Key was used with a different request"},
                outcome,
            )
        else:
            reply = Reply(
                402, {"error": "declined", "message": f"refunds above {config.decline_above} are declined"}, outcome
            )
        store.count(reply.outcome, fault.kind if fault is not None else None)

        # Faults after the effect is stored.
        if fault is not None and fault.kind == "timeout":
            self._sleep(fault)
        elif fault is not None and fault.kind == "error-after-commit":
            reply = Reply(
                503,
                {"error": "service_unavailable", "message": "sandbox fault: the request may have been processed"},
                reply.outcome,
            )
        return reply

    def _refunds(self, query: dict[str, list[str]]) -> Reply:
        store = self.server.store
        if "key" not in query:
            refunds = store.refunds()
            return Reply(200, {"count": len(refunds), "refunds": refunds}, "list")
        self._key = key = check_key(query["key"][0], "the key parameter")
        fault = self._fault = self._header_fault(lookup=True) or self._armed_fault(key, "lookup")
        if fault is not None and fault.kind == "delay":
            self._sleep(fault)
        elif fault is not None and fault.kind == "error":
            reply = Reply(500, {"error": "internal_error", "message": "sandbox fault"}, "error")
            store.count(reply.outcome, fault.kind)
            return reply
        refund = store.refund_by_key(key)
        if refund is None:
            reply = Reply(404, {"error": "not_found", "message": "no refund under this key"}, "not_found")
        else:
            reply = Reply(200, refund, "found")
        store.count(reply.outcome, fault.kind if fault is not None else None)
        if fault is not None and fault.kind == "timeout":
            self._sleep(fault)
        return reply

    def _lookup_many(self, body: bytes) -> Reply:
        """POST /v1/refunds/lookup {"keys": [...]} (at most 1,000): the refunds made under those
        keys, and the keys never seen. Faults do not apply (a batch has no single key)."""
        data = self._json(body)
        keys = data.get("keys") if isinstance(data, dict) else None
        if not isinstance(keys, list) or not 1 <= len(keys) <= MAX_BATCH or not all(isinstance(k, str) for k in keys):
            raise BadRequest(422, "invalid_keys", f'"keys" must be a list of 1 to {MAX_BATCH} keys')
        for key in keys:
            check_key(key, "every key")
        found = self.server.store.refunds_by_keys(sorted(set(keys)))
        reply = Reply(200, {"found": found, "missing": [k for k in keys if k not in found]}, "batch_lookup")
        self.server.store.count(reply.outcome)
        return reply

    def _arm(self, body: bytes) -> Reply:
        data = self._json(body)

        def invalid(message: str) -> BadRequest:
            return BadRequest(422, "invalid_request", message)

        if not isinstance(data, dict):
            raise invalid("the body must be a JSON object")
        unknown = sorted(set(data) - {"key", "fault", "times", "on"})
        if unknown:
            raise invalid(f"unknown field(s): {', '.join(unknown)}")
        key = data.get("key")
        if not isinstance(key, str) or not KEY_RE.fullmatch(key):
            raise invalid(f"key must be 1 to {MAX_KEY_LENGTH} printable ASCII characters without spaces")
        self._key = key
        target = data.get("on", "create")
        if target not in ("create", "lookup", "webhook"):
            raise invalid(
                'on must be "create" (POST /v1/refunds, the default), "lookup" (GET ?key=) '
                'or "webhook" (the outcome event)'
            )
        times = data.get("times", 1)
        if not isinstance(times, int) or isinstance(times, bool) or not 1 <= times <= MAX_TIMES:
            raise invalid(f"times must be an integer from 1 to {MAX_TIMES}")
        fault_text = data.get("fault")
        if not isinstance(fault_text, str):
            raise invalid('fault must be a string such as "timeout=5"')
        try:
            fault: Fault | WebhookFault = (
                parse_webhook_fault(fault_text) if target == "webhook" else parse_fault(fault_text)
            )
        except FaultError as exc:
            raise invalid(str(exc)) from None
        if target == "lookup" and fault.kind not in LOOKUP_KINDS:
            raise invalid(f"fault {fault.kind!r} does not apply to a lookup")
        self._fault = fault
        self.server.store.arm(key, target, str(fault), times)
        return Reply(201, {"key": key, "on": target, "fault": str(fault), "times": times}, "armed")

    def _webhooks(self) -> Reply:
        events = self.server.store.webhook_events()
        return Reply(200, {"count": len(events), "events": events}, "list")

    def _list_faults(self) -> Reply:
        return Reply(200, {"faults": [f.as_json() for f in self.server.store.armed()]}, "list")

    def _reset(self) -> Reply:
        self.server.store.reset()
        return Reply(200, {"reset": True}, "reset")
