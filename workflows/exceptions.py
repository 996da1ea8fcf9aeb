"""Errors the engine raises to callers and to workflow code."""

from __future__ import annotations

from typing import Any


class WorkflowError(Exception):
    """Base class of the engine's errors; ``code`` is the API's error code."""

    code = "workflow_error"


class UnknownWorkflow(WorkflowError):
    code = "unknown_workflow"


class NotStartable(WorkflowError):
    """The workflow exists but is not public: it starts only through its own service (HTTP 403)."""

    code = "not_startable"


class TooManyRuns(WorkflowError):
    """The caller has WORKFLOWS_MAX_ACTIVE_RUNS_PER_OWNER runs going already (HTTP 429)."""

    code = "too_many_runs"


class TooManyEvents(WorkflowError):
    """The run holds WORKFLOWS_MAX_WAITING_EVENTS_PER_RUN events no step has taken yet (HTTP 429)."""

    code = "too_many_events"


class IdempotencyConflict(WorkflowError):
    """The key was used before with a different payload."""

    code = "idempotency_conflict"


class TransitionNotAllowed(WorkflowError):
    """A control (pause, resume, ...) that the run's current state does not allow."""

    code = "transition_not_allowed"

    def __init__(self, message: str, *, status: str) -> None:
        super().__init__(message)
        self.status = status


class InvalidPayload(WorkflowError):
    code = "invalid_payload"


def check_ids(payload: dict[str, Any], *keys: str) -> None:
    """For ``Workflow.validate_payload``: each of ``keys`` is a positive integer (a row's id)."""
    for key in keys:
        value = payload.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**63:
            raise InvalidPayload(f"{key} must be a positive integer id")


class PayloadTooLarge(InvalidPayload):
    """Over WORKFLOWS_MAX_PAYLOAD_BYTES (HTTP 413)."""

    code = "payload_too_large"


class NonRetryableError(Exception):
    """Raise from a step body to fail the step at once, without retries."""


class StepError(Exception):
    """A step that failed for good, raised into ``run()`` the same way on every replay.

    ``error_type`` and ``message`` describe the original error; on the first pass the original
    exception is also chained as ``__cause__``.
    """

    def __init__(self, step: str, error_type: str, message: str) -> None:
        super().__init__(f"step {step!r} failed: {error_type}: {message}")
        self.step = step
        self.error_type = error_type
        self.message = message

    @classmethod
    def from_record(cls, step: str, error: dict[str, Any] | None) -> StepError:
        error = error or {}
        return cls(step, str(error.get("type", "Error")), str(error.get("message", "")))


class WaitTimeout(StepError):
    """``step.wait_for_event`` saw no event of its type before the timeout."""


class StepTimeout(Exception):
    """One try of a step ran past its timeout."""


class NonDeterminismError(Exception):
    """On replay, the workflow reached a stored step position under another name."""


class ResultTooLarge(NonRetryableError):
    pass


class NotSerializable(NonRetryableError):
    pass
