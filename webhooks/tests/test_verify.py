"""The three signature schemes, as pure functions: no database, no settings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from webhooks.verify import (
    MalformedEvent,
    SignatureRejected,
    sign_github,
    sign_standard,
    sign_stripe,
    verify_github,
    verify_standard,
    verify_stripe,
)

NOW = 1_800_000_000
OLD, NEW = "whsec_" + "b2xkLXNlY3JldC1zaXh0ZWVuIQ==", "a-new-secret-of-more-than-16-bytes"
BODY = b'{"id": "evt_1", "data": {"key": "refund:1"}}'


def rejected(verify: Callable[..., str], headers: dict[str, str], *, body: bytes = BODY, **options: Any) -> str:
    """The reason ``verify`` refuses the delivery for (it must refuse it)."""
    with pytest.raises(SignatureRejected) as refusal:
        verify(headers=headers, body=body, secrets=options.get("secrets", [OLD]), tolerance=300, now=NOW)
    assert refusal.value.message  # always words for people too
    return refusal.value.reason


# --- standard -------------------------------------------------------------------------------------
def standard(secret: str = OLD, *, at: int = NOW, body: bytes = BODY) -> dict[str, str]:
    return sign_standard(secret=secret, event_id="msg_1", timestamp=at, body=body)


def test_standard_valid() -> None:
    assert verify_standard(headers=standard(), body=BODY, secrets=[OLD], tolerance=300, now=NOW) == "msg_1"


def test_standard_headers_are_read_whatever_their_case() -> None:
    headers = {name.upper(): value for name, value in standard().items()}
    assert verify_standard(headers=headers, body=BODY, secrets=[OLD], tolerance=300, now=NOW) == "msg_1"


def test_standard_wrong_secret() -> None:
    assert rejected(verify_standard, standard(NEW)) == "bad_signature"


def test_standard_the_second_secret_of_a_rotation_is_valid() -> None:
    assert verify_standard(headers=standard(NEW), body=BODY, secrets=[OLD, NEW], tolerance=300, now=NOW) == "msg_1"


def test_standard_one_matching_signature_among_several_is_enough() -> None:
    headers = standard()
    headers["webhook-signature"] = f"v1,{standard(NEW)['webhook-signature'][3:]} v1a,xyz {headers['webhook-signature']}"
    assert verify_standard(headers=headers, body=BODY, secrets=[OLD], tolerance=300, now=NOW) == "msg_1"


def test_standard_tampered_body() -> None:
    assert rejected(verify_standard, standard(), body=BODY.replace(b"refund:1", b"refund:2")) == "bad_signature"


@pytest.mark.parametrize(("offset", "reason"), [(-360, "stale_timestamp"), (360, "future_timestamp")])
def test_standard_timestamp_six_minutes_off(offset: int, reason: str) -> None:
    assert rejected(verify_standard, standard(at=NOW + offset)) == reason


@pytest.mark.parametrize(("offset", "words"), [(-300.3, "is 301 s old"), (300.3, "is 301 s ahead")])
def test_a_refused_timestamp_is_said_to_be_past_the_tolerance(offset: float, words: str) -> None:
    # a clock's fraction of a second is never rounded into "300 s ahead; at most 300 s is accepted"
    headers = standard(at=NOW)
    with pytest.raises(SignatureRejected, match=words):
        verify_standard(headers=headers, body=BODY, secrets=[OLD], tolerance=300, now=NOW - offset)


def test_standard_timestamp_within_tolerance_both_ways() -> None:
    for offset in (-299, 299):
        headers = standard(at=NOW + offset)
        assert verify_standard(headers=headers, body=BODY, secrets=[OLD], tolerance=300, now=NOW) == "msg_1"


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_standard_missing_header(missing: str) -> None:
    headers = {k: v for k, v in standard().items() if k != missing}
    assert rejected(verify_standard, headers) == "missing_header"


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("webhook-signature", "v1 abc"),  # no comma
        ("webhook-signature", "v1,not base64!"),
        ("webhook-signature", "v2,aGVsbG8="),  # no v1 at all
        ("webhook-timestamp", "yesterday"),
        ("webhook-timestamp", "-5"),
        ("webhook-id", "has space"),
        ("webhook-id", "x" * 201),
    ],
)
def test_standard_malformed_header(header: str, value: str) -> None:
    assert rejected(verify_standard, {**standard(), header: value}) == "malformed_header"


def test_no_secret_verifies_nothing() -> None:
    assert rejected(verify_standard, standard(), secrets=[]) == "no_secret"


# --- stripe ---------------------------------------------------------------------------------------
def stripe(secret: str = OLD, *, at: int = NOW, body: bytes = BODY) -> dict[str, str]:
    return sign_stripe(secret=secret, timestamp=at, body=body)


def test_stripe_valid_takes_the_id_from_the_body() -> None:
    assert verify_stripe(headers=stripe(), body=BODY, secrets=[OLD], tolerance=300, now=NOW) == "evt_1"


def test_stripe_wrong_secret() -> None:
    assert rejected(verify_stripe, stripe(NEW)) == "bad_signature"


def test_stripe_rotated_secret_and_several_v1() -> None:
    # Stripe signs with both secrets while one is rolled: two v1 values, either may match.
    both = f"{stripe(NEW)['Stripe-Signature']},v1={stripe(OLD)['Stripe-Signature'].split('v1=')[1]}"
    assert verify_stripe(headers={"Stripe-Signature": both}, body=BODY, secrets=[OLD], tolerance=300, now=NOW)
    assert verify_stripe(headers=stripe(NEW), body=BODY, secrets=[OLD, NEW], tolerance=300, now=NOW) == "evt_1"


def test_stripe_tampered_body() -> None:
    assert rejected(verify_stripe, stripe(), body=BODY + b" ") == "bad_signature"


@pytest.mark.parametrize(("offset", "reason"), [(-360, "stale_timestamp"), (360, "future_timestamp")])
def test_stripe_timestamp_six_minutes_off(offset: int, reason: str) -> None:
    assert rejected(verify_stripe, stripe(at=NOW + offset)) == reason


def test_stripe_missing_header() -> None:
    assert rejected(verify_stripe, {}) == "missing_header"


@pytest.mark.parametrize(
    "value",
    [
        "garbage",
        f"v1={'00' * 32}",  # no t
        f"t={NOW},t={NOW},v1={'00' * 32}",  # two t
        f"t={NOW}",  # no v1
        f"t={NOW},v1=zz",  # not hex
        f"t=soon,v1={'00' * 32}",
    ],
)
def test_stripe_malformed_header(value: str) -> None:
    assert rejected(verify_stripe, {"Stripe-Signature": value}) == "malformed_header"


def test_stripe_signed_body_without_an_id_is_a_malformed_event() -> None:
    body = b'{"no": "id"}'
    with pytest.raises(MalformedEvent):
        verify_stripe(headers=stripe(body=body), body=body, secrets=[OLD], tolerance=300, now=NOW)


# --- github ---------------------------------------------------------------------------------------
def github(secret: str = OLD, *, body: bytes = BODY) -> dict[str, str]:
    return sign_github(secret=secret, delivery="72d3162e-cc78-11e3-81ab-4c9367dc0958", body=body)


def test_github_valid_takes_the_id_from_the_delivery_header() -> None:
    event_id = verify_github(headers=github(), body=BODY, secrets=[OLD], tolerance=300, now=NOW)
    assert event_id == "72d3162e-cc78-11e3-81ab-4c9367dc0958"


def test_github_wrong_secret() -> None:
    assert rejected(verify_github, github(NEW)) == "bad_signature"


def test_github_rotated_secret() -> None:
    assert verify_github(headers=github(NEW), body=BODY, secrets=[OLD, NEW], tolerance=300, now=NOW)


def test_github_tampered_body() -> None:
    assert rejected(verify_github, github(), body=b"{}") == "bad_signature"


def test_github_has_no_timestamp_to_go_stale() -> None:
    # Its signature covers the body only: an old delivery verifies, and its id is what dedupes it.
    assert verify_github(headers=github(), body=BODY, secrets=[OLD], tolerance=300, now=NOW + 10**6)


@pytest.mark.parametrize("missing", ["X-Hub-Signature-256", "X-GitHub-Delivery"])
def test_github_missing_header(missing: str) -> None:
    assert rejected(verify_github, {k: v for k, v in github().items() if k != missing}) == "missing_header"


@pytest.mark.parametrize("value", ["sha1=abcd", "sha256", "sha256=zz", "abcd"])
def test_github_malformed_header(value: str) -> None:
    assert rejected(verify_github, {**github(), "X-Hub-Signature-256": value}) == "malformed_header"
