"""Writes of the webhooks app: check an inbound delivery, then record it and do its work.

``check_delivery`` decides whether a delivery may be accepted (size, signature, JSON) and writes
nothing; ``delivery_receive`` records what became of it:

- rejected: one rejected delivery row, nothing else (``delivery_reject``); for one refused before
  its signature held, none past the limits of ``webhooks.rejections``;
- accepted: the accepted row and the action's work in ONE transaction (``delivery_accept``). The
  partial unique constraint on (source, event_id) for accepted rows makes a second delivery of the
  same event wait for the first to commit, and then not write its accepted row (an insert that
  does nothing on that conflict, ``webhooks.statements``): it never runs the action. Where the
  scheme signs the body only (github), (source, replay_key) is unique the same way: the same
  signed body under another event id is a second delivery too;
- duplicate: that row, nothing else.

A source with ``act: later`` is accepted differently (``delivery_accept_later``): the event's
shape is checked without the database, then its accepted row is committed ``pending`` with the
body as received, in one statement (the same unique index deduplicates it), and a task is sent to
run the action in a worker (``delivery_act``): the action and the row marked ``done`` commit
together, under the row's lock, so it runs once however often the task arrives. An action that
fails is tried again later, up to WEBHOOKS_ACT_ATTEMPTS times; the sweep (``delivery_sweep``, from
beat) sends the task again for a pending row whose message was lost.
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
from django.db.models import Q
from django.utils import timezone
from django.utils.crypto import salted_hmac

from ledger.redaction import REDACTED, redact
from ledger.services import PurgeResult, purge_in_batches, retention_cutoff
from webhooks.actions import ActionDeferred, ActionRefused, ActionResult, Event, action_check, action_perform
from webhooks.conf import Source, source_get
from webhooks.metrics import ACTION_TRIES, DELIVERIES
from webhooks.models import OPEN_ACTIONS, UNVERIFIED_REASONS, ActionState, Outcome, WebhookDelivery
from webhooks.rejections import record_allowed
from webhooks.selectors import accepted_like, deliveries_received_before, open_actions_received_before
from webhooks.statements import insert_accepted, insert_delivery, record_result
from webhooks.verify import ID_UNSIGNED, SCHEMES, MalformedEvent, SignatureRejected, claimed_event_id
from workflows import outbox
from workflows.conf import conf as workflows_conf
from workflows.storable import MAX_JSON_DEPTH, json_loads_strict, json_problem

logger = logging.getLogger("webhooks")

# The Celery tasks' names (webhooks.tasks registers them; beat names the sweep too).
ACT_TASK = "webhooks.act"
SWEEP_TASK = "webhooks.sweep"

# Header names whose values are credentials or signatures: never stored. Matched as substrings of
# the lower-cased name, so x-hub-signature-256, stripe-signature, x-sig, x-api-key, x-pass,
# x-session-id and x-jwt are all caught (a harmless header with such a name is redacted too).
SECRET_HEADER_PARTS = (
    "sig",
    "secret",
    "token",
    "auth",
    "cookie",
    "key",
    "pass",
    "credential",
    "hmac",
    "session",
    "jwt",
    "bearer",
    "csrf",
    "private",
    "principal",  # x-ms-client-principal: a proxy's account of who called
    "oidc",  # x-amzn-oidc-data: a load balancer's signed token
    "cert",  # x-ssl-client-cert
    "saml",
)


class Rejection(Exception):
    """Why a delivery is refused, with the HTTP status its sender gets."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message

    @property
    def unverified(self) -> bool:
        """Refused before the signature held (401, 413): anyone's to cause. The reasons a stored
        row is judged by too (``WebhookDelivery.event_id_verified``)."""
        return self.reason in UNVERIFIED_REASONS


@dataclass(frozen=True)
class Checked:
    event_id: str
    body: Any  # the parsed JSON
    digest: str  # body_digest() of the body as received
    replay_key: str = ""  # replay_key() of it, for a scheme that signs the body only


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
    # ASCII digits only: "²".isdigit() is true, and int() refuses it (the server refuses such a header first)
    if (
        content_length
        and content_length.isascii()
        and content_length.isdigit()
        and int(content_length) > source.max_body_bytes
    ):
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
    return Checked(
        event_id=event_id,
        body=parse_json(body),
        digest=body_digest(source.name, event_id, body),
        replay_key=replay_key(source.name, body) if source.scheme in ID_UNSIGNED else "",
    )


def body_digest(source: str, event_id: str, body: bytes) -> str:
    """What a delivery row keeps to tell a replayed body from another (``body_digest``): HMAC-SHA256
    of the source, the event id and the body under a key derived from SECRET_KEY.

    Not a plain hash: the body as received holds what the stored one has redacted, and a plain hash
    of it would confirm a guess of that. The event's names are in it because digests are compared
    only within one event: equal bodies of two events (the same email, say) get unequal digests. A
    new SECRET_KEY makes new digests: a replay of an event accepted before it keeps its body."""
    named = f"{source}\0{event_id}\0".encode()
    return salted_hmac("webhooks.body_digest", named + body, algorithm="sha256").hexdigest()


def replay_key(source: str, body: bytes) -> str:
    """What identifies a delivery of a scheme that signs its body only (github), whatever event id
    it claims: HMAC-SHA256 of the source and the body under a key derived from SECRET_KEY (keyed for
    the reason ``body_digest`` is). One accepted row per source has it: the same signed body sent
    again under a new X-GitHub-Delivery is a duplicate. A new SECRET_KEY makes new keys: a body
    accepted before it would be accepted once more."""
    return salted_hmac("webhooks.replay_key", f"{source}\0".encode() + body, algorithm="sha256").hexdigest()


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
    *, source: Source, headers: Mapping[str, str], body: bytes, now: float | None = None, address: str | None = None
) -> tuple[WebhookDelivery | None, Rejection | None]:
    """Check, then record: the delivery row, and the rejection if it was refused.

    ``address``: the sender's, as the request came (``accounts.addresses``). Given, a rejection before
    the signature held is recorded only within ``webhooks.rejections``' limits; past them the row
    is None. Without it every rejection is recorded."""
    try:
        checked = check_delivery(source=source, headers=headers, body=body, now=now)
    except Rejection as refused:
        if address is not None:
            return delivery_reject_unverified(
                source=source, headers=headers, size=len(body), rejection=refused, address=address
            ), refused
        return delivery_reject(source=source, headers=headers, size=len(body), rejection=refused), refused
    try:
        if source.act == "later":
            return delivery_accept_later(source=source, headers=headers, size=len(body), checked=checked), None
        return delivery_accept(source=source, headers=headers, size=len(body), checked=checked), None
    except ActionRefused as exc:
        # Rolled back whole: only the rejection is recorded, after the rollback.
        rejection = Rejection(400, exc.code, exc.message)
    except ActionDeferred as exc:
        # The same, but the sender is told to try again: then it may be accepted.
        rejection = Rejection(exc.status, exc.code, exc.message)
    except Exception as exc:
        # A bug or an outage in the action (or, acting later, in storing the delivery): rolled
        # back whole, so nothing was accepted. Recorded, and a 500 tells the sender to try again
        # later, when it may be accepted.
        logger.exception("webhook %s %s: the action failed", source.name, checked.event_id)
        failed = "acted on" if source.act == "now" else "stored"
        rejection = Rejection(500, "action_failed", f"the event could not be {failed} ({type(exc).__name__})")
    delivery = delivery_reject(
        source=source, headers=headers, size=len(body), rejection=rejection, event_id=checked.event_id
    )
    return delivery, rejection


def delivery_reject(
    *, source: Source, headers: Mapping[str, str], size: int, rejection: Rejection, event_id: str | None = None
) -> WebhookDelivery:
    """Record a refused delivery, and nothing else. Its body is not kept (see the model).

    ``event_id``: the event's, verified (an accepted event whose action failed); by default the id
    its headers claim, unverified, so that "did we receive msg_1?" finds it, rejected."""
    delivery = WebhookDelivery.objects.create(
        source=source.name,
        event_id=claimed_event_id(source.scheme, headers) if event_id is None else event_id,
        outcome=Outcome.REJECTED,
        reason=rejection.reason,
        message=rejection.message,
        headers=redact_headers(headers),
        size=size,
    )
    # The reason's code only: a message may quote what the sender sent (it is on the record instead).
    _delivered(delivery, logging.WARNING, "webhook %s rejected (%s), delivery %s", rejection.reason, delivery.pk)
    return delivery


def delivery_reject_unverified(
    *, source: Source, headers: Mapping[str, str], size: int, rejection: Rejection, address: str
) -> WebhookDelivery | None:
    """``delivery_reject``, for a delivery refused before (or without) its signature holding: if
    it is one anyone could send (401, 413), recorded only while the sender and the source are
    within ``webhooks.rejections``' limits, else None (counted, not stored)."""
    if rejection.unverified and not record_allowed(source=source.name, address=address):
        return None
    return delivery_reject(source=source, headers=headers, size=size, rejection=rejection)


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


def _row(*, source: Source, headers: Mapping[str, str], size: int, checked: Checked) -> dict[str, Any]:
    """What an accepted or duplicate delivery row keeps of the request: headers and body redacted."""
    return {
        "source": source.name,
        "event_id": checked.event_id,
        "headers": redact_headers(headers),
        "body": redact(checked.body),
        "body_digest": checked.digest,
        "replay_key": checked.replay_key,
        "size": size,
    }


def _record_duplicate(row: dict[str, Any], *, received_at: datetime) -> WebhookDelivery:
    """Record a second delivery of an event the source accepted (by its id, or by its body where the
    scheme signs the body only). Its body is kept only if it is not the accepted delivery's (by
    ``body_digest``, or the replay key): a captured delivery replayed stores its headers each time,
    never another copy of a body of up to max_body_bytes."""
    duplicate = WebhookDelivery(outcome=Outcome.DUPLICATE, received_at=received_at, **row)
    first = accepted_like(source=row["source"], event_id=row["event_id"], replay_key=row["replay_key"])
    if first is None:
        # The accepted insert met a conflict, but on no accepted row: its primary key (a sequence
        # behind the table). Not a duplicate: an error, so that the sender is answered 500 and
        # tries again, rather than an event lost behind a 200.
        raise RuntimeError(f"webhook {row['source']} {row['event_id']}: the delivery's row could not be stored")
    same_key = bool(row["replay_key"]) and first.replay_key == row["replay_key"]
    if same_key or (row["body_digest"] and first.body_digest == row["body_digest"]):
        duplicate.body = None
        if first.event_id == row["event_id"]:
            duplicate.message = f"the body of accepted delivery {first.pk}, not kept again"
        else:  # the id is not signed (a replay key matched): the body is what was accepted
            duplicate.message = (
                f"the signed body of accepted delivery {first.pk} (event {first.event_id}) under another "
                "event id: a replay, not acted on; its body is not kept again"
            )
    insert_delivery(duplicate)
    return duplicate


def delivery_accept(*, source: Source, headers: Mapping[str, str], size: int, checked: Checked) -> WebhookDelivery:
    """Accept the event once: the accepted row and the action's work commit together.

    Raises ActionRefused (nothing kept) if the action cannot act on the event. A concurrent or
    earlier acceptance of the same (source, event id) makes this one a duplicate: its accepted row
    is not written (a concurrent one is waited for, and written only if that one rolls back), the
    action does not run, and the duplicate row is recorded instead.
    """
    row = _row(source=source, headers=headers, size=size, checked=checked)
    with transaction.atomic():
        # The row first: a second delivery of this event waits here, on the unique index, until
        # the first commits (then it is a duplicate) or rolls back (then it goes on).
        now = timezone.now()
        delivery = WebhookDelivery(
            outcome=Outcome.ACCEPTED, action_state=ActionState.DONE, received_at=now, acted_at=now, **row
        )
        if not insert_accepted(delivery):
            duplicate = _record_duplicate(row, received_at=now)
        else:
            duplicate = None
            event = Event(source=source.name, event_id=checked.event_id, body=checked.body)
            _keep_result(delivery, action_perform(source.action, event))
            record_result(delivery)
    if duplicate is not None:
        _delivered(duplicate, logging.INFO, "webhook %s %s: a duplicate", checked.event_id)
        return duplicate
    _delivered(delivery, logging.INFO, "webhook %s %s accepted (delivery %s)", checked.event_id, delivery.pk)
    return delivery


def _keep_result(delivery: WebhookDelivery, done: ActionResult) -> None:
    delivery.run_id = done.get("run_id")
    delivery.operation_key = done.get("operation_key", "")
    delivery.submission_id = done.get("submission_id")
    delivery.result = json.loads(json.dumps(done.get("result"), default=str))


def delivery_accept_later(
    *, source: Source, headers: Mapping[str, str], size: int, checked: Checked
) -> WebhookDelivery:
    """Accept the event for a worker to act on: its row committed ``pending`` in one autocommit
    statement, then the task that acts (``delivery_act``) sent.

    Raises ActionRefused, writing nothing, for an event whose shape does not fit the action. A
    second delivery of an accepted event is recorded as a duplicate, as by ``delivery_accept``. If
    the task cannot be sent (the broker is away), the 202 stands: the row is committed, and the
    sweep sends the task once the row is WEBHOOKS_ACT_GRACE_SECONDS overdue."""
    action_check(source.action, Event(source=source.name, event_id=checked.event_id, body=checked.body))
    row = _row(source=source, headers=headers, size=size, checked=checked)
    now = timezone.now()
    delivery = WebhookDelivery(
        outcome=Outcome.ACCEPTED,
        action_state=ActionState.PENDING,
        received_at=now,
        act_after=now,
        raw_body=checked.body,
        **row,
    )
    if insert_accepted(delivery):
        _send_act(delivery.pk, 0)
        message = "webhook %s %s accepted, to act on (delivery %s)"
        _delivered(delivery, logging.INFO, message, checked.event_id, delivery.pk)
        return delivery
    duplicate = _record_duplicate(row, received_at=now)
    _delivered(duplicate, logging.INFO, "webhook %s %s: a duplicate", checked.event_id)
    return duplicate


def _send_act(delivery_id: int, tries: int, *, countdown: float | None = None) -> None:
    """The act task for the delivery's try after ``tries`` counted ones, sent on commit (at once
    outside a transaction) on the workflows' queue (WORKFLOWS_QUEUE), which the workers consume."""
    options: dict[str, Any] = {"queue": workflows_conf()["QUEUE"]}
    if countdown:
        options["countdown"] = countdown
    outbox.send_on_commit(ACT_TASK, (delivery_id, tries), **options)


# What acting changes on a delivery row.
ACT_FIELDS = ("action_state", "action_attempts", "act_after", "acted_at", "raw_body", "reason", "message")
# (swept_at is the sweep's and the operator's: a try leaves it.)


def _pending(delivery_id: int, tries: int, *, mine: bool = False) -> WebhookDelivery | None:
    """The delivery, locked, if its action is pending after ``tries`` counted tries; else None.

    A task is sent for one try (``tries`` travels in it), so a second message for the same try (the
    broker delivering it again, the sweep sending it while the first waited in a long queue) finds
    the try counted already, or the row locked by the task making it (SKIP LOCKED: it does not wait
    for a try in progress, which will record its own end), and does nothing.

    ``mine``: the task counted try ``tries`` itself, and now acts or records how it ended. It waits
    for the lock rather than skip the row: what else holds it is brief (such a second message
    checking it, the sweep), and skipping would leave the try undone until the sweep's next."""
    pending = WebhookDelivery.objects.select_for_update(skip_locked=not mine)
    return pending.filter(pk=delivery_id, action_state=ActionState.PENDING, action_attempts=tries).first()


def delivery_act(delivery_id: int, tries: int = 0) -> WebhookDelivery | None:
    """Make the try after ``tries`` of the action of a pending delivery (source ``act: later``);
    what its task calls. Returns the delivery as it is left, or None if that try is not to be made
    here (made already, being made, or the delivery is not pending).

    The try is counted, and the next one scheduled (``act_after``), in a first short transaction:
    a worker killed in the action (or a child Celery kills at its time limit) has used a try, and
    the sweep sends the next once it is overdue, so an event that kills its worker ends ``failed``
    after WEBHOOKS_ACT_ATTEMPTS. The action and the row marked ``done`` then commit together, under
    the row's lock. One that refuses the event leaves it ``refused``; one that fails (a deferral,
    a bug, an outage) is tried again after the back-off, and ``failed`` after the last try."""
    with transaction.atomic():
        delivery = _pending(delivery_id, tries)
        if delivery is None:
            return None
        if tries >= settings.WEBHOOKS_ACT_ATTEMPTS:  # the tries were used by ones that never ended
            message = f"none of its {tries} tries finished (each worker stopped in it)"
            return _act_failed(delivery_id, tries, final=False, reason="action_failed", message=message)
        tried = tries + 1
        delivery.action_attempts = tried
        delivery.act_after = timezone.now() + timedelta(seconds=act_backoff(tried))
        delivery.save(update_fields=("action_attempts", "act_after"))
    try:
        with transaction.atomic():
            delivery = _pending(delivery_id, tried, mine=True)
            if delivery is None:
                return None
            source = source_get(delivery.source)
            if source is None:
                # Removed, or with a problem in this process (the system check reports it): the
                # next try may find it mended. It acts as the source is configured at the try.
                gone = f"no webhook source {delivery.source!r} is configured without problems in this worker"
                raise ActionDeferred(503, "source_gone", gone)
            event = Event(source=delivery.source, event_id=delivery.event_id, body=delivery.raw_body)
            _keep_result(delivery, action_perform(source.action, event))
            delivery.action_state, delivery.acted_at = ActionState.DONE, timezone.now()
            delivery.act_after, delivery.raw_body, delivery.reason, delivery.message = None, None, "", ""
            delivery.save(update_fields=(*ACT_FIELDS, "run", "operation_key", "submission", "result"))
    except ActionRefused as exc:
        return _act_failed(delivery_id, tried, final=True, reason=exc.code, message=exc.message)
    except ActionDeferred as exc:
        return _act_failed(delivery_id, tried, final=False, reason=exc.code, message=exc.message)
    except Exception as exc:
        logger.exception("webhook delivery %s: the action failed", delivery_id)
        reason, message = "action_failed", f"the event could not be acted on ({type(exc).__name__})"
        return _act_failed(delivery_id, tried, final=False, reason=reason, message=message)
    _acted(delivery)
    return delivery


def act_backoff(tries: int) -> float:
    """Seconds before trying again after ``tries`` tries: 5, 15, 45, ... up to an hour."""
    return float(min(5 * 3 ** (tries - 1), 3600))


def _act_failed(delivery_id: int, tried: int, *, final: bool, reason: str, message: str) -> WebhookDelivery | None:
    """Record how try number ``tried`` ended without acting (its transaction was rolled back, or
    its worker stopped in it): refused for good, failed after the last try, or the next try's task
    sent, due at ``act_after``. Inside a transaction that holds the row already, it finds it too."""
    with transaction.atomic():
        delivery = _pending(delivery_id, tried, mine=True)
        if delivery is None:
            return None
        now = timezone.now()
        delivery.reason, delivery.message = reason, message
        if final:
            delivery.action_state, delivery.acted_at, delivery.raw_body = ActionState.REFUSED, now, None
            delivery.act_after = None
        elif tried >= settings.WEBHOOKS_ACT_ATTEMPTS:
            delivery.action_state, delivery.act_after = ActionState.FAILED, None
        else:
            due = delivery.act_after or now
            _send_act(delivery.pk, tried, countdown=max(0.0, (due - now).total_seconds()))
        delivery.save(update_fields=ACT_FIELDS)
    _acted(delivery)
    return delivery


def _acted(delivery: WebhookDelivery) -> None:
    """The log line and count of one try of a later action (by source and where it left it)."""
    ACTION_TRIES.labels(delivery.source, delivery.action_state).inc()
    level = logging.INFO if delivery.action_state == ActionState.DONE else logging.WARNING
    logger.log(
        level,
        "webhook %s %s: action %s (try %s)%s",
        delivery.source,
        delivery.event_id,
        delivery.action_state,
        delivery.action_attempts,
        f", {delivery.reason}" if delivery.reason else "",
        extra={
            "event": f"delivery.action.{delivery.action_state}",
            "source": delivery.source,
            "event_id": delivery.event_id,
            "delivery_id": delivery.pk,
            "action_state": delivery.action_state,
            "reason": delivery.reason or None,
            "run_id": str(delivery.run_id) if delivery.run_id else None,
            "operation_key": delivery.operation_key or None,
        },
    )


def delivery_sweep(*, now: datetime | None = None, batch: int = 500) -> int:
    """Send the act task again for pending deliveries overdue by more than WEBHOOKS_ACT_GRACE_SECONDS
    (their message was lost: a broker restart, a send that failed, a worker killed in a try); how
    many. A row a try holds is skipped (that try records its end), and one sent again is not sent
    again before another grace has passed (``swept_at``), so a slow queue is not sent the same
    delivery every sweep; its due time stays, so the metrics still say how late it is."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=settings.WEBHOOKS_ACT_GRACE_SECONDS)
    overdue = WebhookDelivery.objects.filter(action_state=ActionState.PENDING, act_after__lt=stale).filter(
        Q(swept_at__isnull=True) | Q(swept_at__lt=stale)
    )
    with transaction.atomic():
        rows = list(
            overdue.select_for_update(skip_locked=True)
            .order_by("act_after")
            .values_list("pk", "action_attempts")[:batch]
        )
        WebhookDelivery.objects.filter(pk__in=[pk for pk, _ in rows]).update(swept_at=now)
        for pk, tries in rows:
            _send_act(pk, tries)
    if rows:
        logger.warning("webhooks: sent %d overdue action(s) again", len(rows), extra={"event": "delivery.swept"})
    return len(rows)


def delivery_act_again(delivery_ids: list[int], *, by: str) -> list[int]:
    """An operator's "act now" (``by`` says who): the failed deliveries among ``delivery_ids``
    pending again with their tries counted from 0, the pending ones (waiting out a back-off, their
    cause mended) due now, and their tasks sent; the ids of those. A pending one whose tries were
    all used by workers that stopped in them gets its tries from 0 too, as a failed one does. A row
    a try holds is left to it.

    Each row's message says who acted on it again and how it was before (its last failure), until
    its next try ends; the log line says the same."""
    with transaction.atomic():
        rows = list(
            WebhookDelivery.objects.select_for_update(skip_locked=True)
            .filter(pk__in=delivery_ids, action_state__in=OPEN_ACTIONS)
            .exclude(raw_body=None)
            .values_list("pk", "action_state", "action_attempts", "reason", "message")
        )
        now = timezone.now()
        for pk, state, tries, reason, message in rows:
            before = f"{state} after {tries} tr{'y' if tries == 1 else 'ies'}" + (
                f" ({reason}: {message})" if reason else ""
            )
            fresh = state == ActionState.FAILED or tries >= settings.WEBHOOKS_ACT_ATTEMPTS
            WebhookDelivery.objects.filter(pk=pk).update(
                action_state=ActionState.PENDING,
                action_attempts=0 if fresh else tries,
                reason="",
                message=f"acted on again by {by}; before: {before}",
                act_after=now,
                swept_at=None,
            )
            _send_act(pk, 0 if fresh else tries)
            logger.info(
                "webhooks: acting now on delivery %s, by %s; before: %s",
                pk,
                by,
                before,
                extra={"event": "delivery.act_again"},
            )
    return [pk for pk, *_ in rows]


@dataclass(frozen=True)
class DeliveryPurgeResult(PurgeResult):
    kept_pending: int = 0  # older, and kept: their action is pending
    kept_failed: int = 0  # older, and kept: their action failed (include_failed deletes them)


def delivery_purge(
    *,
    older_than: timedelta | None = None,
    dry_run: bool = False,
    include_failed: bool = False,
    now: datetime | None = None,
) -> DeliveryPurgeResult:
    """Delete delivery records received before now - ``older_than`` (default WEBHOOKS_RETENTION_DAYS),
    in batches of short transactions, as the ledger's record_purge does. A delivery whose action is
    pending is kept, however old (it is work not yet done), and so is a failed one unless
    ``include_failed`` (an operator's decision that it will not be acted on again).

    Deleting an accepted row lets the same event id be accepted again: a sender that replays an
    event older than the retention period starts its work again (a workflow start still answers
    with the run its idempotency key already has; a settled operation stays as it is). At a source
    of the github scheme it lets the same body be accepted again under a new delivery id, which is
    a new event with its own run."""
    cutoff = retention_cutoff(older_than, default_days=settings.WEBHOOKS_RETENTION_DAYS, now=now)
    result = purge_in_batches(
        deliveries_received_before(cutoff, include_failed=include_failed), cutoff=cutoff, dry_run=dry_run
    )
    kept = open_actions_received_before(cutoff)
    pending, failed = kept.get(ActionState.PENDING, 0), 0 if include_failed else kept.get(ActionState.FAILED, 0)
    if not dry_run:
        logger.info(
            "purged %d webhook deliveries received before %s (kept %d pending, %d failed)",
            result.count,
            cutoff.isoformat(),
            pending,
            failed,
        )
    return DeliveryPurgeResult(
        count=result.count, cutoff=cutoff, dry_run=dry_run, kept_pending=pending, kept_failed=failed
    )
