"""The durable workflow engine.

    from workflows import Workflow, workflow, Retries, NonRetryableError
    from workflows import start, send_event, pause, resume, terminate, restart

The services are imported lazily so that importing this package does not need Django's app
registry to be ready (workflow modules import it at app-loading time).
"""

from typing import TYPE_CHECKING, Any

from workflows.context import StepContext, current_step
from workflows.exceptions import (
    IdempotencyConflict,
    NonDeterminismError,
    NonRetryableError,
    StepError,
    StepTimeout,
    TransitionNotAllowed,
    UnknownWorkflow,
    WaitTimeout,
)
from workflows.registry import Event, Workflow, workflow
from workflows.retries import Retries

if TYPE_CHECKING:  # what __getattr__ below returns, for the type checker ("as": exported)
    from workflows.public import pause as pause
    from workflows.public import restart as restart
    from workflows.public import resume as resume
    from workflows.public import send_event as send_event
    from workflows.public import start as start
    from workflows.public import terminate as terminate

_SERVICES = ("start", "send_event", "pause", "resume", "terminate", "restart")

__all__ = [
    "Event",
    "StepContext",
    "current_step",
    "IdempotencyConflict",
    "NonDeterminismError",
    "NonRetryableError",
    "Retries",
    "StepError",
    "StepTimeout",
    "TransitionNotAllowed",
    "UnknownWorkflow",
    "WaitTimeout",
    "Workflow",
    "workflow",
    *_SERVICES,
]


def __getattr__(name: str) -> Any:
    if name in _SERVICES:
        from workflows import public

        return getattr(public, name)
    raise AttributeError(f"module 'workflows' has no attribute {name!r}")
