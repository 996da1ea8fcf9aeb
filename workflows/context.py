"""Which run and step the current code runs in, for code called from a step body (the ledger
records it with each external operation, so a run's in-flight effects can be listed)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from uuid import UUID


@dataclass(frozen=True)
class StepContext:
    run_id: UUID
    attempt: int
    step: str
    # The lease owner of the worker running the body ("" for a step sent to another queue, which
    # runs without the run's lease): writes fenced by the lease (the agents' chunks) check it.
    owner: str = ""


_current: ContextVar[StepContext | None] = ContextVar("workflows_current_step", default=None)


def current_step() -> StepContext | None:
    """The step whose body is running in this thread, or None outside a step body."""
    return _current.get()


@contextmanager
def in_step(run_id: UUID, attempt: int, step: str, owner: str = "") -> Iterator[None]:
    token = _current.set(StepContext(run_id, attempt, step, owner))
    try:
        yield
    finally:
        _current.reset(token)
