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


def conf() -> LedgerSettings:
    """Read at call time, so tests that override settings.LEDGER see their values."""
    return cast(LedgerSettings, settings.LEDGER)


def stale_after() -> timedelta:
    """How long after its last submit a ``submitted`` operation is taken to be no longer in flight."""
    return timedelta(seconds=conf()["STALE_SUBMITTED_SECONDS"])
