"""Sources the webhook tests configure, and signed requests to them."""

from __future__ import annotations

import json
import time
from typing import Any

from webhooks.verify import sign_github, sign_standard, sign_stripe

SECRET = "whsec_" + "dGVzdC1zZWNyZXQtb2YtdGhlLXN1aXRl"  # "test-secret-of-the-suite"
ROTATED = "the-next-secret-while-rotating"
OUTCOMES = {"type": "operation_outcome", "system": "payments"}
SOURCES: dict[str, Any] = {
    "runs": {
        "scheme": "standard",
        "secrets": [SECRET, ROTATED],
        "max_body_bytes": 4096,
        "action": {"type": "workflow", "workflow": "test.echo", "payload_from": "data"},
    },
    "hub": {
        "scheme": "github",
        "secrets": [SECRET],
        "action": {"type": "workflow", "workflow": "test.echo", "payload_from": ""},
    },
    "payments": {"scheme": "stripe", "secrets": [SECRET], "action": OUTCOMES},
    "sandbox": {"scheme": "standard", "secrets": [SECRET], "action": OUTCOMES},
}


def encode(body: Any) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


def standard_headers(body: bytes, event_id: str, *, secret: str = SECRET, at: float | None = None) -> dict[str, str]:
    return sign_standard(secret=secret, event_id=event_id, timestamp=int(time.time() if at is None else at), body=body)


def stripe_headers(body: bytes, *, secret: str = SECRET, at: float | None = None) -> dict[str, str]:
    return sign_stripe(secret=secret, timestamp=int(time.time() if at is None else at), body=body)


def github_headers(body: bytes, delivery: str, *, secret: str = SECRET) -> dict[str, str]:
    return sign_github(secret=secret, delivery=delivery, body=body)


def outcome_event(key: str, status: str, **record: Any) -> dict[str, Any]:
    """What a payment provider posts when one of our operations settles: its record of it."""
    return {"type": f"refund.{status}", "data": {"key": key, "status": status, **record}}


def perform_workflow_with(monkeypatch: Any, perform: Any) -> None:
    """The ``workflow`` action with ``perform`` in place of its own (its checks kept) for the test."""
    from webhooks import actions

    monkeypatch.setitem(
        actions.ACTIONS, "workflow", actions.ActionType(actions._workflow_problems, actions._workflow_check, perform)
    )
