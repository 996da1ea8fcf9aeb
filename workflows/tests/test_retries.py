from datetime import timedelta

import pytest

from workflows import Retries


def test_defaults_are_cloudflares() -> None:
    retries = Retries()
    assert (retries.limit, retries.delay, retries.backoff) == (5, timedelta(seconds=10), "exponential")


@pytest.mark.parametrize(
    ("backoff", "delays"),
    [("constant", [2, 2, 2, 2]), ("linear", [2, 4, 6, 8]), ("exponential", [2, 4, 8, 16])],
)
def test_delay_before_each_retry(backoff: str, delays: list[int]) -> None:
    retries = Retries(limit=4, delay=timedelta(seconds=2), backoff=backoff)  # type: ignore[arg-type]
    assert [retries.delay_before(n).total_seconds() for n in range(1, 5)] == delays


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="backoff"):
        Retries(backoff="random")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit"):
        Retries(limit=-1)
