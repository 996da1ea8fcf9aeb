from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

Backoff = Literal["constant", "linear", "exponential"]


@dataclass(frozen=True)
class Retries:
    """How a failing step is tried again. Defaults are Cloudflare Workflows': 5 retries, 10 s, exponential.

    ``limit`` counts retries, so a step runs at most ``limit + 1`` times.
    """

    limit: int = 5
    delay: timedelta = timedelta(seconds=10)
    backoff: Backoff = "exponential"

    def __post_init__(self) -> None:
        if self.limit < 0:
            raise ValueError("Retries.limit must be 0 or more")
        if self.backoff not in ("constant", "linear", "exponential"):
            raise ValueError(f"Retries.backoff must be constant, linear or exponential, not {self.backoff!r}")
        if not isinstance(self.delay, timedelta):
            object.__setattr__(self, "delay", timedelta(seconds=float(self.delay)))

    def delay_before(self, retry: int) -> timedelta:
        """The wait before retry number ``retry`` (1 for the first retry)."""
        if self.backoff == "constant":
            return self.delay
        if self.backoff == "linear":
            return self.delay * retry
        factor: float = 2 ** (retry - 1)  # typed, as int ** int is Any (a negative power gives a float)
        return self.delay * factor


DEFAULT_RETRIES = Retries()
DEFAULT_TIMEOUT = timedelta(minutes=10)
