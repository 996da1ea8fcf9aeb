"""The ledger's settings (``settings.LEDGER``), typed and read at call time."""

from __future__ import annotations

from datetime import timedelta
from typing import TypedDict, cast

from django.conf import settings


class LedgerSettings(TypedDict):
    CONNECT_TIMEOUT: float
    READ_TIMEOUT: float
    STALE_SUBMITTED_SECONDS: float
    REDACT_KEYS: list[str]
    RETENTION_DAYS: int
    RECONCILE_CONCURRENCY: int
    PROVIDER_GRACE_SECONDS: float
    RECHECK_RESOLVED_DAYS: float


def conf() -> LedgerSettings:
    """Read at call time, so tests that override settings.LEDGER see their values."""
    return cast(LedgerSettings, settings.LEDGER)


def stale_after() -> timedelta:
    """How long after its last submit a ``submitted`` operation is taken to be no longer in flight."""
    return timedelta(seconds=conf()["STALE_SUBMITTED_SECONDS"])


def in_flight_window() -> timedelta:
    """How long after a send the request may still reach the provider and take effect: the longest a
    call may last (connect, write and read timeouts) plus LEDGER PROVIDER_GRACE_SECONDS for a
    provider that is still processing it when our side gave up. A lookup that answers "not found"
    within this window proves nothing: the request may be on its way, or queued at the provider."""
    settings = conf()
    seconds = settings["CONNECT_TIMEOUT"] + 2 * settings["READ_TIMEOUT"] + settings["PROVIDER_GRACE_SECONDS"]
    return timedelta(seconds=seconds)
