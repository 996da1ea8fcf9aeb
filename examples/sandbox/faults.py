"""Fault injection: the faults a request can be told to suffer, and how they are written.

A fault is written as in the ``X-Sandbox-Fault`` header or the ``fault`` field of
``POST /v1/faults``:

- ``delay=<seconds>``: sleep, then answer normally.
- ``timeout`` or ``timeout=<seconds>``: do what the request asks (store the refund), then sleep
  long enough that the client's read timeout fires (the server's ``--timeout-seconds`` unless
  given), then answer normally to whoever is still listening.
- ``error``: answer 500 and do nothing.
- ``error-after-commit``: do what the request asks, then answer 503 instead of the real answer.
- ``reject``: answer 402 ``declined`` and do nothing.

On a lookup (``GET /v1/refunds?key=``) only ``delay``, ``timeout`` and ``error`` make sense.

Webhook faults act on the outcome event of a refund (``POST /v1/faults {"on": "webhook"}`` for one
key, ``--webhook-faults`` for every event; several apply together):

- ``drop``: never send this event (it is listed as ``dropped``).
- ``duplicate``: send it twice in a row (the same id and body), once it is delivered.
- ``delay=<seconds>``: send it that much later than it would have gone.
- ``reorder`` or ``reorder=<n>``: hold it until ``n`` (10) events are held, or the oldest has
  waited ``--webhook-hold-seconds``, then send the whole burst newest first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

FaultKind = Literal["delay", "timeout", "error", "error-after-commit", "reject"]

KINDS: tuple[FaultKind, ...] = ("delay", "timeout", "error", "error-after-commit", "reject")
LOOKUP_KINDS: frozenset[str] = frozenset({"delay", "timeout", "error"})
MAX_SECONDS = 600.0

WebhookFaultKind = Literal["drop", "duplicate", "delay", "reorder"]
WEBHOOK_KINDS: tuple[WebhookFaultKind, ...] = ("drop", "duplicate", "delay", "reorder")
DEFAULT_BURST = 10
MAX_BURST = 1000


class FaultError(ValueError):
    """The fault is not written as this module expects."""


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    seconds: float | None = None  # delay and timeout only; None means the server's default

    def __str__(self) -> str:
        if self.seconds is None:
            return self.kind
        return f"{self.kind}={self.seconds:g}"


def parse_fault(text: str) -> Fault:
    """``"delay=1.5"`` → ``Fault("delay", 1.5)``; raises FaultError on anything else."""
    name, sep, value = text.strip().partition("=")
    name = name.strip().lower()
    kind = next((k for k in KINDS if k == name), None)
    if kind is None:
        raise FaultError(f"unknown fault {name!r}; expected one of {', '.join(KINDS)}")
    if not sep:
        if kind == "delay":
            raise FaultError("delay needs seconds: delay=<seconds>")
        return Fault(kind)
    if kind not in ("delay", "timeout"):
        raise FaultError(f"fault {kind!r} takes no value")
    try:
        seconds = float(value)
    except ValueError:
        raise FaultError(f"{kind} needs a number of seconds, not {value.strip()!r}") from None
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_SECONDS:
        raise FaultError(f"{kind} seconds must be between 0 and {MAX_SECONDS:g}")
    return Fault(kind, seconds)


@dataclass(frozen=True)
class WebhookFault:
    kind: WebhookFaultKind
    value: float | None = None  # delay: seconds; reorder: how many held events make a burst

    def __str__(self) -> str:
        if self.value is None:
            return self.kind
        return f"{self.kind}={self.value:g}"

    @property
    def burst(self) -> int:
        return int(self.value) if self.kind == "reorder" and self.value is not None else DEFAULT_BURST


def parse_webhook_fault(text: str) -> WebhookFault:
    """``"delay=2"`` → ``WebhookFault("delay", 2.0)``, ``"reorder"`` → ``WebhookFault("reorder")``;
    raises FaultError on anything else."""
    name, sep, value = text.strip().partition("=")
    name = name.strip().lower()
    kind = next((k for k in WEBHOOK_KINDS if k == name), None)
    if kind is None:
        raise FaultError(f"unknown webhook fault {name!r}; expected one of {', '.join(WEBHOOK_KINDS)}")
    if not sep:
        if kind == "delay":
            raise FaultError("delay needs seconds: delay=<seconds>")
        return WebhookFault(kind)
    if kind == "delay":
        try:
            seconds = float(value)
        except ValueError:
            raise FaultError(f"delay needs a number of seconds, not {value.strip()!r}") from None
        if not math.isfinite(seconds) or not 0 <= seconds <= MAX_SECONDS:
            raise FaultError(f"delay seconds must be between 0 and {MAX_SECONDS:g}")
        return WebhookFault(kind, seconds)
    if kind == "reorder":
        if not value.strip().isdigit() or not 2 <= int(value) <= MAX_BURST:
            raise FaultError(f"reorder takes a whole number of events from 2 to {MAX_BURST}")
        return WebhookFault(kind, float(int(value)))
    raise FaultError(f"webhook fault {kind!r} takes no value")


def parse_webhook_faults(text: str) -> tuple[WebhookFault, ...]:
    """Comma-separated webhook faults, e.g. ``"reorder=5,duplicate"``; "" is none."""
    return tuple(parse_webhook_fault(part) for part in text.split(",") if part.strip())
