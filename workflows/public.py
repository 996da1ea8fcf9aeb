"""The engine's public functions (docs/architecture.md#writing-a-workflow); thin over the services."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from uuid import UUID

from workflows import services
from workflows.models import RunEvent, WorkflowRun

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def _id(run: WorkflowRun | UUID | str) -> UUID:
    return run.id if isinstance(run, WorkflowRun) else UUID(str(run))


def start(
    name: str,
    payload: dict[str, Any],
    *,
    idempotency_key: str | None = None,
    owner: User | None = None,
    queue: str | None = None,
) -> WorkflowRun:
    run, _ = services.run_start(
        workflow=name, payload=payload, idempotency_key=idempotency_key, owner=owner, queue=queue
    )
    return run


def send_event(
    run: WorkflowRun | UUID | str, type: str, payload: Any = None, *, idempotency_key: str | None = None
) -> RunEvent:
    event, _ = services.run_send_event(run_id=_id(run), type=type, payload=payload, idempotency_key=idempotency_key)
    return event


def pause(run: WorkflowRun | UUID | str) -> WorkflowRun:
    return services.run_pause(run_id=_id(run))


def resume(run: WorkflowRun | UUID | str) -> WorkflowRun:
    return services.run_resume(run_id=_id(run))


def terminate(run: WorkflowRun | UUID | str) -> WorkflowRun:
    return services.run_terminate(run_id=_id(run))


def restart(run: WorkflowRun | UUID | str) -> WorkflowRun:
    return services.run_restart(run_id=_id(run))
