"""``@workflow(name)`` and the ``Workflow`` base class."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar
from uuid import UUID

from workflows.exceptions import InvalidPayload, UnknownWorkflow

if TYPE_CHECKING:
    from workflows.engine import Step

_registry: dict[str, type[Workflow]] = {}

W = TypeVar("W", bound="type[Workflow]")


@dataclass(frozen=True)
class Event:
    """What ``run()`` receives: the run's payload and identity, who started it (``owner_id``, None
    for a run started by the system), and the workflow's ``version`` when the run started: a
    workflow that changes its steps keeps the old ones for runs started at an older version (the
    engine replays every run with today's code)."""

    payload: dict[str, Any]
    run_id: UUID
    created_at: datetime
    attempt: int
    owner_id: int | None = None
    version: str = ""


class Workflow:
    """Subclass, decorate with ``@workflow("name")`` and write ``run(event, step)``.

    ``run`` is replayed from the top each time the run advances: code outside steps must be
    deterministic and safe to repeat.
    """

    name: str = ""
    version: str = "1"
    # Startable by anyone signed in, over ``POST /api/workflows/<name>/runs`` and ``manage.py
    # workflows start``: set by ``@workflow(name, public=True)``. A process with its own service
    # and API (a refund, an assessment) stays private and starts only through that service, which
    # checks who may start it and builds its payload.
    public: bool = False
    # Started only by its own app's code, for rows that code made (a chat turn, a fiber): a schedule
    # or a webhook source may not name it, as they may a private workflow. Set by
    # ``@workflow(name, internal=True)``.
    internal: bool = False
    # A permission ("app_label.codename") needed to see this workflow's runs at all, by their owner
    # and by staff who see every run alike: set by ``@workflow(name, view_permission=...)`` for a
    # process whose steps hold what only that permission may read (a chat turn's steps hold the
    # conversation it answered). Without it, who sees a run is its owner and such staff.
    view_permission: str | None = None
    # The payload's JSON Schema (draft 2020-12), or None for any JSON object. The default
    # ``validate_payload`` checks it, and the API's schema states it: a public workflow with one
    # has its own operation there, POST /api/workflows/<name>/runs with this payload.
    payload_schema: ClassVar[dict[str, Any] | None] = None
    run_id: UUID
    _engine_step: Step | None = None  # the engine's, while it advances the run

    def run(self, event: Event, step: Step) -> Any:
        raise NotImplementedError

    @classmethod
    def validate_payload(cls, payload: dict[str, Any]) -> dict[str, Any]:
        """The payload to store for a new run, or InvalidPayload saying what is wrong (a 400 over
        HTTP). Called by every start, before anything is written. The default takes any JSON
        object that ``payload_schema`` allows; a workflow with inputs states their types and bounds
        there, or checks them here (a public workflow must: its payload comes from whoever is signed
        in; the schema also tells the API's clients)."""
        if cls.payload_schema is not None:
            from jsonschema import Draft202012Validator
            from jsonschema.exceptions import best_match

            error = best_match(Draft202012Validator(cls.payload_schema).iter_errors(payload))
            if error is not None:
                where = "".join(f"[{part!r}]" for part in error.absolute_path)
                raise InvalidPayload(f"payload{where}: {error.message}"[:500])
        return payload

    def report_progress(self, data: Any) -> None:
        """Best effort, not durable. Not sent again while ``run()`` replays what an earlier
        execution ran (``Step.replaying``): a page's progress does not go back at each resume. One
        made just before a crash or a suspension may be sent again, one lost with its process is lost."""
        from workflows.streams import publish_progress

        if not self._replaying():
            publish_progress(self.run_id, data)

    def broadcast(self, message: Any) -> None:
        """Best effort, not durable, not sent again on replay (as ``report_progress``). Sent by the
        process's publisher thread, in order with the run's other events (its one event loop keeps
        one channel-layer connection)."""
        from workflows.streams import publish_later

        if not self._replaying():
            publish_later(self.run_id, "broadcast", message)

    def _replaying(self) -> bool:
        return self._engine_step is not None and self._engine_step.replaying


def workflow(
    name: str, *, public: bool = False, internal: bool = False, view_permission: str | None = None
) -> Callable[[W], W]:
    """Register the decorated Workflow subclass as ``name``; ``public`` makes it startable over the
    API and the command line (see ``Workflow.public``); ``internal`` keeps it to its own app's code
    (see ``Workflow.internal``); ``view_permission`` is needed to see its runs (see
    ``Workflow.view_permission``)."""

    def register(cls: W) -> W:
        if not (isinstance(cls, type) and issubclass(cls, Workflow)):
            raise TypeError(f"@workflow({name!r}) decorates a subclass of Workflow")
        if public and internal:
            raise ValueError(f"@workflow({name!r}): a workflow is public or internal, not both")
        existing = _registry.get(name)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            where = f"{existing.__module__}.{existing.__qualname__}"
            raise ValueError(f"workflow {name!r} is already registered by {where}")
        cls.name = name
        cls.public = public
        cls.internal = internal
        cls.view_permission = view_permission
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


def internal_refusal(name: str, by: str) -> str | None:
    """Why ``by`` (a schedule, a webhook source) may not start workflow ``name``, if it is internal."""
    cls = get_workflow(name)
    if not cls.internal:
        return None
    return f"workflow {name!r} is started only by its own app ({cls.__module__}), for what it made: not by {by}"


def view_permissions() -> dict[str, str]:
    """The registered workflows whose runs need a permission to be seen, and that permission."""
    return {name: cls.view_permission for name, cls in _registry.items() if cls.view_permission}


def import_workflow_modules(modules: list[str]) -> None:
    for module in modules:
        importlib.import_module(module)
