"""The sandbox provider's outcome webhooks: a background thread that settles pending refunds when
their time comes and posts the outbox's events, signed per Standard Webhooks, retrying failures.

Each event is ``{"type": "refund.succeeded" | "refund.failed", "timestamp", "data": <the refund
as GET /v1/refunds?key= answers it>}``, posted with the headers ``webhook-id`` (the event's id, the
same on every attempt), ``webhook-timestamp`` (Unix seconds, of this attempt) and
``webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`` keyed with the
secret (``whsec_<base64>``: the bytes after the prefix, decoded; anything else: its UTF-8 bytes).

A 2xx answer delivers the event. A connection error, a timeout, a 5xx, 408, 409 or 429 (or any
other answer) is tried again after ``backoff`` seconds, doubling up to ``MAX_BACKOFF``, until
``max_attempts`` attempts were made; another 4xx is given up at once (the receiver refused it).
Given up, an event is listed ``failed`` with the last answer. The events wait in SQLite, so a
restarted sandbox goes on delivering them; an attempt cut short by a kill is made again (a
receiver sees an event at least once, and deduplicates by ``webhook-id``).

Standard library only, like the rest of the provider.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import http.client
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlsplit

from examples.sandbox.store import Store, WebhookEvent

MAX_BACKOFF = 30.0
RETRYABLE_4XX = frozenset({408, 409, 429})
POLL_SECONDS = 0.05


class WebhookConfigError(ValueError):
    """The webhook URL or secret cannot be used."""


def secret_key(secret: str) -> bytes:
    """``whsec_<base64>`` → the decoded bytes; any other secret → its UTF-8 bytes."""
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
        except binascii.Error:
            raise WebhookConfigError("a whsec_ secret must be base64 after the prefix") from None
    return secret.encode()


def sign(*, key: bytes, event_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt."""
    digest = hmac.new(key, f"{event_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return {
        "webhook-id": event_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": f"v1,{base64.b64encode(digest).decode()}",
    }


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookConfigError(f"the webhook URL must be http(s)://host[:port]/path, not {url!r}")
    return url


@dataclass(frozen=True)
class WebhookConfig:
    url: str | None = None  # None: no webhooks (pending refunds still settle)
    secret: str = field(default="", repr=False)  # never printed
    faults: tuple[str, ...] = ()  # webhook faults every event suffers (faults.py)
    max_attempts: int = 8
    backoff: float = 0.5  # seconds before the second attempt, doubled after each failure
    hold_seconds: float = 10.0  # the longest a reordered event waits for its burst
    timeout: float = 10.0  # connect and read timeout of one POST

    @property
    def enabled(self) -> bool:
        return self.url is not None


def retry_delay(config: WebhookConfig, attempts: int) -> float:
    """Seconds to wait after the ``attempts``-th failed attempt."""
    return float(min(config.backoff * 2 ** (attempts - 1), MAX_BACKOFF))


@dataclass(frozen=True)
class Answer:
    status: int | None  # None: no HTTP answer (connection refused, reset, timed out)
    text: str  # "202", or what went wrong


def post(url: str, *, headers: dict[str, str], body: bytes, timeout: float) -> Answer:
    """One POST on a fresh connection; never raises for the network's sake."""
    parts = urlsplit(url)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = connection_class(parts.hostname or "", parts.port, timeout=timeout)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    try:
        conn.request(
            "POST",
            path,
            body=body,
            headers={
                **headers,
                "Content-Type": "application/json",
                "User-Agent": "SandboxProvider-Webhooks/1",
            },
        )
        response = conn.getresponse()
        response.read()
        return Answer(response.status, str(response.status))
    except (OSError, http.client.HTTPException) as exc:
        return Answer(None, f"{type(exc).__name__}: {exc}"[:200])
    finally:
        conn.close()


class Dispatcher(threading.Thread):
    """Settles the due pending refunds, releases reordered bursts, posts the due events."""

    def __init__(self, store: Store, config: WebhookConfig, log_lock: threading.Lock) -> None:
        super().__init__(name="webhooks", daemon=True)
        self.store, self.config, self.log_lock = store, config, log_lock
        self.key = secret_key(config.secret) if config.enabled else b""
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(POLL_SECONDS):
            try:
                self.tick()
            except Exception:  # a bug or a locked file: say so, keep going
                traceback.print_exc(file=sys.stderr)

    def stop(self) -> None:
        self.stopping.set()

    def tick(self) -> None:
        faults = self.config.faults if self.config.enabled else None
        self.store.settle_due(webhook_faults=faults)
        if not self.config.enabled:
            return
        self.store.release_bursts(hold_seconds=self.config.hold_seconds)
        for event in self.store.due_events():
            if self.stopping.is_set():
                return
            self.deliver(event)

    def deliver(self, event: WebhookEvent) -> None:
        assert self.config.url is not None
        started = time.monotonic()
        attempt = event.attempts + 1
        answer = self._send(event)
        sends = 1
        if answer.status is not None and 200 <= answer.status < 300:
            for _ in range(event.copies - 1):  # the duplicate fault: the same event again
                self._log(event, attempt, self._send(event), "duplicate", started)
                sends += 1
            self.store.record_attempt(event.seq, result=answer.text, sends=sends, delivered=True, retry_at=None)
            self._log(event, attempt, answer, "delivered", started)
            return
        refused = answer.status is not None and 400 <= answer.status < 500 and answer.status not in RETRYABLE_4XX
        if refused or attempt >= self.config.max_attempts:
            self.store.record_attempt(event.seq, result=answer.text, sends=sends, delivered=False, retry_at=None)
            self._log(event, attempt, answer, "failed", started)
            return
        retry_at = time.time() + retry_delay(self.config, attempt)
        self.store.record_attempt(event.seq, result=answer.text, sends=sends, delivered=False, retry_at=retry_at)
        self._log(event, attempt, answer, "retry", started)

    def _send(self, event: WebhookEvent) -> Answer:
        assert self.config.url is not None
        headers = sign(key=self.key, event_id=event.id, timestamp=int(time.time()), body=event.body)
        return post(self.config.url, headers=headers, body=event.body, timeout=self.config.timeout)

    def _log(self, event: WebhookEvent, attempt: int, answer: Answer, outcome: str, started: float) -> None:
        # Like the request log: no body, so no order, amount or reason.
        elapsed_ms = (time.monotonic() - started) * 1000
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        result = answer.text if answer.status is not None else "no-answer"
        line = (
            f"{now} WEBHOOK {event.id} key={event.key} attempt={attempt} "
            f"status={result} outcome={outcome} {elapsed_ms:.0f}ms\n"
        )
        with self.log_lock:
            sys.stdout.write(line)
            sys.stdout.flush()
