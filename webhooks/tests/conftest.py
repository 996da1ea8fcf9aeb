from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import own_redis_prefix


@pytest.fixture(autouse=True)
def _own_rejection_counts(settings: Any) -> Iterator[str]:
    """Rejections counted for this test alone (webhooks.rejections): the suite's tests all send from
    127.0.0.1, and a count left by one must not keep another's rejections from being recorded."""
    with own_redis_prefix(settings, "WEBHOOKS_REJECTIONS_KEY_PREFIX", "webhooks-rejected-test") as prefix:
        yield prefix
