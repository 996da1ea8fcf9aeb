"""The ledger's fixtures: a fake provider on a real socket, and a "payments" adapter pointing at it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ledger import HttpAdapter, register_adapter, unregister_adapter
from ledger.tests.provider import FakeProvider

# Short timeouts so a hanging provider costs the suite half a second, not thirty.
# A lookup's "not found" is believed 2.5 s after the last send (0.5 + 2 x 0.5 + a grace of 1).
TEST_LEDGER = {
    "CONNECT_TIMEOUT": 0.5,
    "READ_TIMEOUT": 0.5,
    "STALE_SUBMITTED_SECONDS": 5.0,
    "PROVIDER_GRACE_SECONDS": 1.0,
}


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    fake = FakeProvider()
    yield fake
    fake.stop()


@pytest.fixture
def ledger_settings(settings: Any) -> Any:
    settings.LEDGER = {**settings.LEDGER, **TEST_LEDGER}
    return settings


@pytest.fixture
def payments(provider: FakeProvider, ledger_settings: Any) -> Iterator[FakeProvider]:
    """The "payments" system, served by the fake provider (lookups at /<action>/<key>)."""
    register_adapter("payments", HttpAdapter(base_url=provider.url))
    yield provider
    unregister_adapter("payments")
