from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis


@pytest.fixture(autouse=True)
def _own_rejection_counts(settings: Any) -> Iterator[str]:
    """Rejections counted for this test alone (webhooks.rejections): the suite's tests all send from
    127.0.0.1, and a count left by one must not keep another's rejections from being recorded."""
    prefix, url = f"webhooks-rejected-test-{uuid.uuid4().hex[:8]}", settings.REDIS_URL
    settings.WEBHOOKS_REJECTIONS_KEY_PREFIX = prefix
    yield prefix
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(f"{prefix}:*"))
    if keys:
        client.delete(*keys)
