"""``@workflow(name)`` and the ``Workflow`` base class."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from workflows.exceptions import UnknownWorkflow

if TYPE_CHECKING:
    from workflows.engine import Step

_registry: dict[str, type[Workflow]] = {}

W = TypeVar("W", bound="type[Workflow]")


@dataclass(frozen=True)
class Event:
    """What ``run()`` receives: the run's payload and identity."""

    payload: dict[str, Any]
    run_id: UUID
    created_at: datetime
    attempt: int


class Workflow:
    """Subclass, decorate with ``@workflow("name")`` and write ``run(event, step)``.

    ``run`` is replayed from the top each time the run advances: code outside steps must be
    deterministic and safe to repeat.
    """

    name: str = ""
    version: str = "1"
    run_id: UUID

    def run(self, event: Event, step: Step) -> Any:
        raise NotImplementedError

    def report_progress(self, data: Any) -> None:
        """Best effort, not durable: may repeat on replay."""
        from workflows.streams import publish_progress

        publish_progress(self.run_id, data)

    def broadcast(self, message: Any) -> None:
        """Best effort, not durable: may repeat on replay."""
        from workflows.streams import publish

        publish(self.run_id, "broadcast", message)


def workflow(name: str) -> Callable[[W], W]:
    def register(cls: W) -> W:
        if not (isinstance(cls, type) and issubclass(cls, Workflow)):
            raise TypeError(f"@workflow({name!r}) decorates a subclass of Workflow")
        existing = _registry.get(name)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            where = f"{existing.__module__}.{existing.__qualname__}"
            raise ValueError(f"workflow {name!r} is already registered by {where}")
        cls.name = name
        _registry[name] = cls
        return cls

    return register


def get_workflow(name: str) -> type[Workflow]:
    try:
        return _registry[name]
    except KeyError:
        raise UnknownWorkflow(f"no workflow is registered as {name!r}") from None


def workflow_names() -> list[str]:
    return sorted(_registry)


def import_workflow_modules(modules: list[str]) -> None:
    for module in modules:
        importlib.import_module(module)
