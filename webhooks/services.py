"""Writes of the webhooks app: check an inbound delivery, then record it and do its work.

``check_delivery`` decides whether a delivery may be accepted (size, signature, JSON) and writes
nothing; ``delivery_receive`` records what became of it:

- rejected: one rejected delivery row, nothing else (``delivery_reject``);
- accepted: the accepted row and the action's work in ONE transaction (``delivery_accept``). The
  partial unique constraint on (source, event_id) for accepted rows makes a second delivery of the
  same event wait for the first to commit, and then not write its accepted row (an insert that
  does nothing on that conflict, ``webhooks.statements``): it never runs the action;
- duplicate: that row, nothing else.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from ledger.redaction import REDACTED, redact
from ledger.services import PurgeResult, purge_in_batches, retention_cutoff
from webhooks.actions import ActionDeferred, ActionRefused, Event, action_perform
from webhooks.conf import Source
from webhooks.metrics import DELIVERIES
from webhooks.models import Outcome, WebhookDelivery
from webhooks.selectors import deliveries_received_before
from webhooks.statements import insert_delivery, record_result
from webhooks.verify import SCHEMES, MalformedEvent, SignatureRejected
from workflows.storable import MAX_JSON_DEPTH, json_loads_strict, json_problem

logger = logging.getLogger("webhooks")

# Header names whose values are credentials or signatures: never stored. Matched as substrings of
# the lower-cased name, so x-hub-signature-256, stripe-signature and x-api-key are all caught.
SECRET_HEADER_PARTS = (
    "signature",
    "secret",
    "token",
    "authorization",
    "cookie",
    "key",
    "password",
    "passwd",
    "credential",
    "hmac",
    "auth",
)


class Rejection(Exception):
    """Why a delivery is refused, with the HTTP status its sender gets."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


@dataclass(frozen=True)
class Checked:
    event_id: str
    body: Any  # the parsed JSON


# What of a delivery's headers is kept: anyone may send a configured source a request, and its
# rejection is recorded, so what one request can make us store is bounded (Twisted alone lets
# through 16 KiB of headers). A webhook's own headers are a few short ones.
MAX_HEADERS_KEPT = 40
MAX_HEADER_CHARS = 256
TRUNCATED = "…[cut]"


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers to store: secret-like ones as REDACTED, the first MAX_HEADERS_KEPT, each name and
    value cut to MAX_HEADER_CHARS characters."""
    kept: dict[str, str] = {}
    for name, value in list(headers.items())[:MAX_HEADERS_KEPT]:
        if any(part in name.lower() for part in SECRET_HEADER_PARTS):
            value = REDACTED
        elif len(value) > MAX_HEADER_CHARS:
            value = value[:MAX_HEADER_CHARS] + TRUNCATED
        kept[name[:MAX_HEADER_CHARS]] = value
    return kept


def check_size(*, source: Source, content_length: str | None) -> None:
    """A declared Content-Length over the source's limit is refused before the body is read."""
    if content_length and content_length.isdigit() and int(content_length) > source.max_body_bytes:
        raise Rejection(413, "payload_too_large", f"the body is larger than {source.max_body_bytes:,} bytes")


def check_delivery(*, source: Source, headers: Mapping[str, str], body: bytes, now: float | None = None) -> Checked:
    """The event id and JSON of a delivery that may be accepted, or a Rejection. Writes nothing.

    ``body`` was read with at most max_body_bytes + 1 bytes: one more means it is too large. The
    signature is checked before the body is parsed: nothing an unverified sender wrote is read."""
    if len(body) > source.max_body_bytes:
        raise Rejection(413, "payload_too_large", f"the body is larger than {source.max_body_bytes:,} bytes")
    verify = SCHEMES[source.scheme]
    try:
        event_id = verify(
            headers=headers,
            body=body,
            secrets=source.secrets,
            tolerance=source.tolerance_seconds,
            now=time.time() if now is None else now,
        )
    except SignatureRejected as exc:
        raise Rejection(401, exc.reason, exc.message) from None
    except MalformedEvent as exc:
        raise Rejection(400, "parse_error", str(exc)) from None
    return Checked(event_id=event_id, body=parse_json(body))


def parse_json(body: bytes) -> Any:
    try:
        value = json_loads_strict(body)
    except RecursionError:  # deeper than the parser goes: far past what is stored
        raise Rejection(400, "parse_error", f"the body is nested more than {MAX_JSON_DEPTH} levels deep") from None
    except ValueError:
        raise Rejection(400, "parse_error", "the body is not JSON (UTF-8)") from None
    if (problem := json_problem(value, max_depth=MAX_JSON_DEPTH)) is not None:
        raise Rejection(400, "parse_error", f"the body {problem}")
    return value


def delivery_receive(
    *, source: Source, headers: Mapping[str, str], body: bytes, now: float | None = None
) -> tuple[WebhookDelivery, Rejection | None]:
    """Check, then record: the delivery row, and the rejection if it was refused."""
    try:
        checked = check_delivery(source=source, headers=headers, body=body, now=now)
    except Rejection as refused:
        return delivery_reject(source=source, headers=headers, size=len(body), rejection=refused), refused
    try:
        return delivery_accept(source=source, headers=headers, size=len(body), checked=checked), None
    except ActionRefused as exc:
        # Rolled back whole: only the rejection is recorded, after the rollback.
        rejection = Rejection(400, exc.code, exc.message)
    except ActionDeferred as exc:
        # The same, but the sender is told to try again: then it may be accepted.
        rejection = Rejection(exc.status, exc.code, exc.message)
    except Exception as exc:
        # A bug or an outage in the action: rolled back whole, so nothing was accepted. Recorded,
        # and a 500 tells the sender to try again later, when it may be accepted.
        logger.exception("webhook %s %s: the action failed", source.name, checked.event_id)
        rejection = Rejection(500, "action_failed", f"the event could not be acted on ({type(exc).__name__})")
    delivery = delivery_reject(
        source=source, headers=headers, size=len(body), rejection=rejection, event_id=checked.event_id
    )
    return delivery, rejection


def delivery_reject(
    *, source: Source, headers: Mapping[str, str], size: int, rejection: Rejection, event_id: str = ""
) -> WebhookDelivery:
    """Record a refused delivery, and nothing else. Its body is not kept (see the model)."""
    delivery = WebhookDelivery.objects.create(
        source=source.name,
        event_id=event_id,
        outcome=Outcome.REJECTED,
        reason=rejection.reason,
        message=rejection.message,
        headers=redact_headers(headers),
        size=size,
    )
    # The reason's code only: a message may quote what the sender sent (it is on the record instead).
    _delivered(delivery, logging.WARNING, "webhook %s rejected (%s), delivery %s", rejection.reason, delivery.pk)
    return delivery


def _delivered(delivery: WebhookDelivery, level: int, message: str, *args: Any) -> None:
    """The delivery's log line and count (by source and outcome); never its body or headers."""
    DELIVERIES.labels(delivery.source, delivery.outcome).inc()
    logger.log(
        level,
        message,
        delivery.source,
        *args,
        extra={
            "event": f"delivery.{delivery.outcome}",
            "source": delivery.source,
            "event_id": delivery.event_id or None,
            "delivery_id": delivery.pk,
            "outcome": delivery.outcome,
            "reason": delivery.reason or None,
            "run_id": str(delivery.run_id) if delivery.run_id else None,
            "operation_key": delivery.operation_key or None,
        },
    )


def delivery_accept(*, source: Source, headers: Mapping[str, str], size: int, checked: Checked) -> WebhookDelivery:
    """Accept the event once: the accepted row and the action's work commit together.

    Raises ActionRefused (nothing kept) if the action cannot act on the event. A concurrent or
    earlier acceptance of the same (source, event id) makes this one a duplicate: its accepted row
    is not written (a concurrent one is waited for, and written only if that one rolls back), the
    action does not run, and the duplicate row is recorded instead.
    """
    row = {
        "source": source.name,
        "event_id": checked.event_id,
        "headers": redact_headers(headers),
        "body": redact(checked.body),
        "size": size,
    }
    with transaction.atomic():
        # The row first: a second delivery of this event waits here, on the unique index, until
        # the first commits (then it is a duplicate) or rolls back (then it goes on).
        delivery = WebhookDelivery(outcome=Outcome.ACCEPTED, **row)
        if not insert_delivery(delivery):
            duplicate = WebhookDelivery(outcome=Outcome.DUPLICATE, **row)
            insert_delivery(duplicate)
        else:
            duplicate = None
            event = Event(source=source.name, event_id=checked.event_id, body=checked.body)
            done = action_perform(source.action, event)
            delivery.run_id = done.get("run_id")
            delivery.operation_key = done.get("operation_key", "")
            delivery.submission_id = done.get("submission_id")
            delivery.result = json.loads(json.dumps(done.get("result"), default=str))
            record_result(delivery)
    if duplicate is not None:
        _delivered(duplicate, logging.INFO, "webhook %s %s: a duplicate", checked.event_id)
        return duplicate
    _delivered(delivery, logging.INFO, "webhook %s %s accepted (delivery %s)", checked.event_id, delivery.pk)
    return delivery


def delivery_purge(
    *, older_than: timedelta | None = None, dry_run: bool = False, now: datetime | None = None
) -> PurgeResult:
    """Delete delivery records received before now - ``older_than`` (default WEBHOOKS_RETENTION_DAYS),
    in batches of short transactions, as the ledger's record_purge does.

    Deleting an accepted row lets the same event id be accepted again: a sender that replays an
    event older than the retention period starts its work again (a workflow start still answers
    with the run its idempotency key already has; a settled operation stays as it is)."""
    cutoff = retention_cutoff(older_than, default_days=settings.WEBHOOKS_RETENTION_DAYS, now=now)
    result = purge_in_batches(deliveries_received_before(cutoff), cutoff=cutoff, dry_run=dry_run)
    if not dry_run:
        logger.info("purged %d webhook deliveries received before %s", result.count, cutoff.isoformat())
    return result
