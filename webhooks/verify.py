"""Signature schemes of inbound webhooks: pure functions, no database, no settings.

Each ``verify_<scheme>(headers=, body=, secrets=, tolerance=, now=)`` returns the event's id or
raises ``SignatureRejected`` with a reason code and a message that says exactly what was wrong.
Signatures are compared with ``hmac.compare_digest`` (constant time: how long a comparison takes
must not tell a forger how many leading bytes they got right), against every configured secret, so
a sender may sign with the old or the new secret while one is rotated.

- ``standard`` (Standard Webhooks): ``webhook-id``, ``webhook-timestamp`` (Unix seconds) and
  ``webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`` (several signatures,
  space-separated; other versions ignored). A ``whsec_`` secret is base64 after the prefix.
- ``stripe``: ``Stripe-Signature: t=<ts>,v1=<hex HMAC-SHA256 of "{t}.{body}">`` (several ``v1``
  allowed); the event id is the JSON body's ``id``.
- ``github``: ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of body>``; the id is
  ``X-GitHub-Delivery``. No timestamp, and the id is not signed: a captured delivery can be sent
  again under a new id, so its body is what identifies it too (``ID_UNSIGNED``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

Reason = Literal[
    "missing_header", "malformed_header", "bad_signature", "stale_timestamp", "future_timestamp", "no_secret"
]
# What an event id may be: it is stored and compared, and becomes part of a run's idempotency key.
EVENT_ID = re.compile(r"^[\x21-\x7e]{1,200}$")


class SignatureRejected(Exception):
    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason: Reason = reason
        self.message = message


class MalformedEvent(Exception):
    """The signature holds but the body is not what the scheme needs (stripe: JSON with an id)."""


def secret_bytes(secret: str) -> bytes:
    """``whsec_<base64>`` → the decoded key (Standard Webhooks' form); anything else as UTF-8.
    A ``whsec_`` secret that is not base64 raises ValueError (the system check reports it)."""
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
        except binascii.Error:
            raise ValueError("a whsec_ secret must be base64 after the prefix") from None
    return secret.encode()


def _hmac(secret: str, message: bytes) -> bytes:
    return hmac.new(secret_bytes(secret), message, hashlib.sha256).digest()


def _header(headers: Mapping[str, str], name: str) -> str:
    """The header ``name`` (given in lower case), whatever the case it was sent in."""
    value = next((v for k, v in headers.items() if k.lower() == name), None)
    if value is None or not value.strip():
        raise SignatureRejected("missing_header", f"the {name} header is missing")
    return value.strip()


def _event_id(value: str, *, where: str) -> str:
    if not EVENT_ID.match(value):
        raise SignatureRejected("malformed_header", f"{where} must be 1 to 200 printable ASCII characters")
    return value


def _timestamp(value: str, *, where: str, tolerance: int, now: float) -> int:
    if not value.isascii() or not value.isdigit() or len(value) > 12:
        raise SignatureRejected("malformed_header", f"{where} must be a Unix time in whole seconds")
    stamp = int(value)
    if stamp < now - tolerance:
        raise SignatureRejected(
            "stale_timestamp", f"{where} is {math.ceil(now - stamp)} s old; at most {tolerance} s is accepted"
        )
    if stamp > now + tolerance:
        raise SignatureRejected(
            "future_timestamp", f"{where} is {math.ceil(stamp - now)} s ahead; at most {tolerance} s is accepted"
        )
    return stamp


def _no_secret(secrets: Sequence[str]) -> None:
    if not secrets:
        raise SignatureRejected("no_secret", "this source has no secret configured: nothing can be verified")


def _matches(candidates: Sequence[bytes], secrets: Sequence[str], message: bytes) -> bool:
    # Every secret against every candidate, without stopping at the first match: the time taken
    # then depends on how many there are, never on which one matched.
    found = False
    for secret in secrets:
        expected = _hmac(secret, message)
        for candidate in candidates:
            found |= hmac.compare_digest(expected, candidate)
    return found


def verify_standard(
    *, headers: Mapping[str, str], body: bytes, secrets: Sequence[str], tolerance: int, now: float
) -> str:
    _no_secret(secrets)
    event_id = _event_id(_header(headers, "webhook-id"), where="webhook-id")
    raw_stamp = _header(headers, "webhook-timestamp")
    signatures = _header(headers, "webhook-signature")
    _timestamp(raw_stamp, where="webhook-timestamp", tolerance=tolerance, now=now)
    candidates: list[bytes] = []
    for item in signatures.split():
        version, comma, value = item.partition(",")
        if not comma:
            raise SignatureRejected("malformed_header", "webhook-signature must be space-separated <version>,<base64>")
        if version != "v1":
            continue  # v1a (asymmetric) and later versions: not ours to check
        try:
            candidates.append(base64.b64decode(value, validate=True))
        except binascii.Error:
            raise SignatureRejected("malformed_header", "a v1 signature in webhook-signature is not base64") from None
    if not candidates:
        raise SignatureRejected("malformed_header", "webhook-signature holds no v1 signature")
    if not _matches(candidates, secrets, f"{event_id}.{raw_stamp}.".encode() + body):
        raise SignatureRejected("bad_signature", "no v1 signature matches the body with any configured secret")
    return event_id


def verify_stripe(
    *, headers: Mapping[str, str], body: bytes, secrets: Sequence[str], tolerance: int, now: float
) -> str:
    _no_secret(secrets)
    header = _header(headers, "stripe-signature")
    stamps: list[str] = []
    candidates: list[bytes] = []
    for item in header.split(","):
        key, equals, value = item.strip().partition("=")
        if not equals:
            raise SignatureRejected("malformed_header", "Stripe-Signature must be comma-separated key=value pairs")
        if key == "t":
            stamps.append(value)
        elif key == "v1":
            try:
                candidates.append(bytes.fromhex(value))
            except ValueError:
                raise SignatureRejected("malformed_header", "a v1 signature in Stripe-Signature is not hex") from None
    if len(stamps) != 1:
        raise SignatureRejected("malformed_header", "Stripe-Signature must hold exactly one t=<timestamp>")
    if not candidates:
        raise SignatureRejected("malformed_header", "Stripe-Signature holds no v1 signature")
    _timestamp(stamps[0], where="the Stripe-Signature timestamp", tolerance=tolerance, now=now)
    if not _matches(candidates, secrets, f"{stamps[0]}.".encode() + body):
        raise SignatureRejected("bad_signature", "no v1 signature matches the body with any configured secret")
    return _stripe_event_id(body)


def _stripe_event_id(body: bytes) -> str:
    try:
        event = json.loads(body)
    except ValueError:
        raise MalformedEvent("the body is not JSON") from None
    event_id = event.get("id") if isinstance(event, dict) else None
    if not isinstance(event_id, str) or not EVENT_ID.match(event_id):
        raise MalformedEvent("the body's id must be a string of 1 to 200 printable ASCII characters")
    return event_id


def verify_github(
    *, headers: Mapping[str, str], body: bytes, secrets: Sequence[str], tolerance: int, now: float
) -> str:
    _no_secret(secrets)
    signature = _header(headers, "x-hub-signature-256")
    event_id = _event_id(_header(headers, "x-github-delivery"), where="X-GitHub-Delivery")
    prefix, equals, value = signature.partition("=")
    if prefix != "sha256" or not equals:
        raise SignatureRejected("malformed_header", "X-Hub-Signature-256 must be sha256=<hex>")
    try:
        candidate = bytes.fromhex(value)
    except ValueError:
        raise SignatureRejected("malformed_header", "X-Hub-Signature-256 is not hex after sha256=") from None
    if not _matches([candidate], secrets, body):
        raise SignatureRejected("bad_signature", "the signature does not match the body with any configured secret")
    return event_id


Verifier = Callable[..., str]
SCHEMES: dict[str, Verifier] = {"standard": verify_standard, "stripe": verify_stripe, "github": verify_github}
# The header that names a delivery's event, for the schemes that have one (stripe's id is in the body).
ID_HEADERS = {"standard": "webhook-id", "github": "x-github-delivery"}


def claimed_event_id(scheme: str, headers: Mapping[str, str]) -> str:
    """The event id a delivery's headers name, unverified ("" if none, or not a well-formed id): what
    a rejected delivery is recorded under, so that a search for the id finds it. Never the body's:
    nothing an unverified sender wrote in it is read."""
    name = ID_HEADERS.get(scheme)
    if name is None:
        return ""
    try:
        return _event_id(_header(headers, name), where=name)
    except SignatureRejected:
        return ""


# Schemes whose signature does not cover the event id (nor a timestamp): only the body is vouched
# for, so a delivery's identity is its body as well as its id.
ID_UNSIGNED = frozenset({"github"})


# --- signing: what a sender does (the tests, and a provider written in Python) --------------------
def sign_standard(*, secret: str, event_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    signature = base64.b64encode(_hmac(secret, f"{event_id}.{timestamp}.".encode() + body)).decode()
    return {"webhook-id": event_id, "webhook-timestamp": str(timestamp), "webhook-signature": f"v1,{signature}"}


def sign_stripe(*, secret: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {"Stripe-Signature": f"t={timestamp},v1={_hmac(secret, f'{timestamp}.'.encode() + body).hex()}"}


def sign_github(*, secret: str, delivery: str, body: bytes) -> dict[str, str]:
    return {"X-Hub-Signature-256": f"sha256={_hmac(secret, body).hex()}", "X-GitHub-Delivery": delivery}
