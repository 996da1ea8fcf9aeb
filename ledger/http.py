"""``HttpAdapter``: a JSON-over-HTTP adapter configured by a base URL and two paths.

What each failure means, which is the whole point of the ledger:

- **Connect error or connect timeout** (refused, unreachable, DNS, TLS handshake, no pooled
  connection in time): the request never left this machine, so the provider cannot have acted.
  ``NoEffect``: the operation goes back to ``pending`` and ``perform`` raises
  ``ProviderUnavailable``, which is safe to retry with the same key.
- **Read or write timeout, connection dropped, malformed answer** after the connection was made:
  the provider may have received the request and acted on it. ``Unknown``: never sent again
  without a lookup first.
- **5xx, 408, 409, 425**: the provider got the request and said something went wrong, but a 500
  can come after the effect was committed and a 502/504 from a gateway says nothing about the
  service behind it. ``Unknown`` too; with a lookup-capable provider the next attempt finds out
  at once (not found → sent again, found → resolved), so this costs one lookup, never a double
  effect.
- **429**: refused before acting (rate limit): ``NoEffect``.
- **Other 4xx**: a definitive rejection (declined, invalid): ``Failed``; the key is spent.

A submit uses a fresh connection (one ``httpx.Client`` per call): a reused keep-alive
connection that the server had closed fails *after* the request was written, which would blur
the line between "never sent" and "sent, no answer" that the first two cases depend on. A lookup
changes nothing, so any failure of it only means "still unknown": lookups reuse one kept-alive
client per thread, which reconciliation of many operations needs. The TLS configuration (loading
the CA bundle costs tens of milliseconds) is built once per process.
"""

from __future__ import annotations

import functools
import logging
import ssl
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from ledger.adapters import (
    Failed,
    LookupOutcome,
    NoEffect,
    NotFound,
    SubmitOutcome,
    Succeeded,
    Unknown,
    contradiction,
    record_of,
)
from ledger.conf import conf

Outcome = TypeVar("Outcome", bound=SubmitOutcome | LookupOutcome)

if TYPE_CHECKING:
    from ledger.models import ExternalOperation

logger = logging.getLogger(__name__)

# Values of a "status" field in a provider's answer.
FAILED_STATES = frozenset({"failed", "declined", "rejected", "canceled", "cancelled"})
PENDING_STATES = frozenset({"pending", "processing", "queued", "in_progress", "accepted"})
UNKNOWN_HTTP = frozenset({408, 409, 425})
# Answers to the batch lookup that mean the provider has no such endpoint (no route, the route of
# something else that takes another method, not implemented).
NO_BATCH_HTTP = frozenset({404, 405, 501})


class HttpAdapter:
    """POST ``base_url + submit_path`` with the request as JSON and ``Idempotency-Key: <op.key>``;
    GET ``base_url + lookup_path`` to ask what happened to the key (200 with the operation, 404 if
    the provider never saw it). Optionally POST ``base_url + batch_lookup_path`` with many keys
    (``lookup_many``); a provider without that endpoint is looked up one key at a time. Paths may
    use ``{action}`` and ``{key}`` (URL-quoted). The README's "provider protocol" says it all.

    Timeouts default to settings.LEDGER CONNECT_TIMEOUT and READ_TIMEOUT, read at call time.
    Subclass and override ``submit_body``, ``submit_outcome``, ``lookup_outcome`` or
    ``body_outcome`` for a provider with another shape.
    """

    def __init__(
        self,
        *,
        base_url: str,
        submit_path: str = "/{action}",
        lookup_path: str | None = "/{action}/{key}",
        batch_lookup_path: str | None = None,
        headers: Mapping[str, str] | None = None,
        connect_timeout: float | None = None,
        read_timeout: float | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # What the outcomes' reasons (stored on the operation, logged) name the provider by: its
        # address without credentials or a query.
        self.where = _public_address(self.base_url)
        self.submit_path = submit_path
        self.lookup_path = lookup_path
        self.batch_lookup_path = batch_lookup_path
        self.headers = dict(headers or {})
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        # Set once the provider answers the batch path as missing: from then on this adapter looks
        # keys up one at a time, without asking again every batch.
        self.batch_lookup_missing = False

    @property
    def can_lookup(self) -> bool:
        return self.lookup_path is not None

    @property
    def can_lookup_many(self) -> bool:
        return self.batch_lookup_path is not None and not self.batch_lookup_missing

    # --- the two calls ---
    def submit(self, op: ExternalOperation) -> SubmitOutcome:
        url = self.url(self.submit_path, op)
        try:
            response = self._send("POST", url, json=self.submit_body(op), headers={"Idempotency-Key": op.key})
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            # No connection, so no byte of the request reached the provider.
            return NoEffect(f"could not connect to {self.where}: {_describe(exc)}")
        except httpx.TimeoutException as exc:
            # Connected and (at least partly) sent: the provider may be acting on it right now.
            return Unknown(f"no answer from {self.where} in time: {_describe(exc)}")
        except httpx.HTTPError as exc:
            return Unknown(f"the request to {self.where} failed after it was sent: {_describe(exc)}")
        return self.believed(op, self.submit_outcome(response))

    def lookup(self, op: ExternalOperation) -> LookupOutcome:
        if self.lookup_path is None:
            return Unknown(f"{self.where} cannot look operations up")
        try:
            response = self._send("GET", self.url(self.lookup_path, op), reuse_connection=True)
        except httpx.HTTPError as exc:
            # A lookup changes nothing at the provider: whatever went wrong, we simply do not know.
            return Unknown(f"the lookup at {self.where} failed: {_describe(exc)}")
        return self.believed(op, self.lookup_outcome(response))

    def lookup_many(self, ops: list[ExternalOperation]) -> list[LookupOutcome]:
        """One POST of ``{"keys": [...]}`` to ``batch_lookup_path`` answered with ``{"found": {key:
        operation}, "missing": [key]}``; without that path, one lookup each. Any failure of the
        batch request means "still unknown" for every key in it, except an answer saying the path
        does not exist (404, 405, 501): then one lookup each, now and from then on."""
        path = self.batch_lookup_path
        if path is None or self.batch_lookup_missing or not ops:
            return [self.lookup(op) for op in ops]
        url = self.url(path, ops[0])
        try:
            response = self._send("POST", url, json={"keys": [op.key for op in ops]}, reuse_connection=True)
        except httpx.HTTPError as exc:
            return [Unknown(f"the lookup at {self.where} failed: {_describe(exc)}")] * len(ops)
        if response.status_code in NO_BATCH_HTTP:
            self.batch_lookup_missing = True  # a plain flag: threads racing here at worst ask once each
            logger.warning(
                "%s has no batch lookup (POST %s answered HTTP %s): looking keys up one at a time",
                self.where,
                _public_address(url),
                response.status_code,
            )
            return [self.lookup(op) for op in ops]
        body = _json(response) if response.status_code == 200 else None
        if not (
            isinstance(body, dict) and isinstance(body.get("found"), dict) and isinstance(body.get("missing"), list)
        ):
            return [Unknown(f"the batch lookup answered HTTP {response.status_code}")] * len(ops)
        found, missing = body["found"], set(body["missing"])
        return [
            self.believed(op, self.body_outcome(found[op.key]))
            if op.key in found
            else NotFound()
            if op.key in missing
            else Unknown("the batch lookup did not mention this key")
            for op in ops
        ]

    # --- what answers mean ---
    def believed(self, op: ExternalOperation, outcome: Outcome) -> Outcome | Unknown:
        """``outcome``, unless it settles ``op`` on a record that is not its own: then Unknown, for a
        person to look at. A success whose body is not JSON (a proxy's or a misconfigured URL's
        page) says nothing of the operation; a record whose key or echoed request fields differ
        from ours is another operation's (``ledger.adapters.contradiction``)."""
        if not isinstance(outcome, Succeeded | Failed):
            return outcome
        record = record_of(outcome)
        if isinstance(outcome, Succeeded) and isinstance(record, dict) and record.get(NOT_JSON):
            return Unknown(f"{self.where} answered with a body that is not JSON: it says nothing of this operation")
        if (problem := contradiction(op, record)) is not None:
            return Unknown(f"the provider's record is not this operation's ({problem}): left unknown for a person")
        return outcome

    def submit_body(self, op: ExternalOperation) -> Any:
        return op.request

    def submit_outcome(self, response: httpx.Response) -> SubmitOutcome:
        status = response.status_code
        if response.is_success:
            return self.body_outcome(_json(response))
        if status == 429:
            return NoEffect("the provider refused it before acting (HTTP 429, too many requests)")
        if status in UNKNOWN_HTTP or status >= 500:
            return Unknown(f"the provider answered HTTP {status}; it may or may not have acted")
        if 400 <= status < 500:
            body = _json(response)
            return Failed(reason=_error_code(body) or f"http_{status}", detail=body)
        return Unknown(f"unexpected HTTP {status} from the provider")

    def lookup_outcome(self, response: httpx.Response) -> LookupOutcome:
        if response.status_code == 404:
            return NotFound()
        if response.status_code == 200:
            return self.body_outcome(_json(response))
        return Unknown(f"the lookup answered HTTP {response.status_code}")

    def body_outcome(self, body: Any) -> Succeeded | Failed | Unknown:
        """A 2xx answer (to a submit or a lookup) by its ``status`` field, if it has one."""
        state = str(body.get("status", "")).lower() if isinstance(body, dict) else ""
        if state in FAILED_STATES:
            # failure_reason first: a record's plain "reason" may be the request's own (why it was asked for).
            reason = body.get("failure_reason") or body.get("reason") or _error_code(body) or state
            return Failed(reason=str(reason), detail=body)
        if state in PENDING_STATES:
            return Unknown(f"the provider says the operation is {state}")
        return Succeeded(response=body)

    # --- plumbing ---
    def url(self, path: str, op: ExternalOperation) -> str:
        return self.base_url + path.format(action=quote(op.action, safe=""), key=quote(op.key, safe=""))

    def timeout(self) -> httpx.Timeout:
        settings = conf()
        connect = self.connect_timeout if self.connect_timeout is not None else settings["CONNECT_TIMEOUT"]
        read = self.read_timeout if self.read_timeout is not None else settings["READ_TIMEOUT"]
        return httpx.Timeout(connect=connect, read=read, write=read, pool=connect)

    def _send(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        reuse_connection: bool = False,
    ) -> httpx.Response:
        all_headers = {"Accept": "application/json", **self.headers, **(headers or {})}
        if reuse_connection:  # lookups only: see the module docstring
            response = self._kept_alive().request(method, url, json=json, headers=all_headers)
        else:
            # A client per call: a fresh connection, see the module docstring.
            with httpx.Client(timeout=self.timeout(), verify=_tls()) as client:
                response = client.request(method, url, json=json, headers=all_headers)
        # Method, URL and status only: bodies may hold personal data (the services log them redacted).
        logger.debug("%s %s → HTTP %s", method, url, response.status_code)
        return response

    def _kept_alive(self) -> httpx.Client:
        """This thread's lookup client for these timeouts (URLs are absolute, so any adapter
        with the same timeouts can share it)."""
        timeout = self.timeout()
        clients: _Clients = _lookup_clients.__dict__.setdefault("clients", _Clients())
        key = (timeout.connect, timeout.read)
        client = clients.get(key)
        if client is None:
            client = clients[key] = httpx.Client(timeout=timeout, verify=_tls())
        return client


class _Clients(dict[tuple[Any, ...], httpx.Client]):
    """A thread's lookup clients, closed with their connections when the thread ends and its
    thread-local data goes (reconciliation's pool of lookup threads ends with each batch)."""

    def __del__(self) -> None:
        for client in self.values():
            client.close()


_lookup_clients = threading.local()  # per thread: an httpx.Client is not shared across threads here


@functools.cache
def _tls() -> ssl.SSLContext:
    return httpx.create_ssl_context()


NOT_JSON = "_not_json"  # marks what _json made of a body that is not JSON


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return {"body": response.text[:2000], NOT_JSON: True}


def _error_code(body: Any) -> str | None:
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    if isinstance(error, dict) and error.get("code"):
        return str(error["code"])
    if isinstance(error, str) and error:
        return error
    return str(body["code"]) if body.get("code") else None


def _public_address(url: str) -> str:
    """``url`` without a user, a password or a query (``https://key:secret@pay.example/v1?x=1`` is
    ``https://pay.example/v1``)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
