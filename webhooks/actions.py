"""What an accepted event becomes: the source's ``action``, by its ``type``.

Each type has a check of its configuration (``problems``, run by the system check) and a
``perform`` that runs inside the transaction that inserts the accepted delivery: the event's
effect and its deduplication commit together, or neither does. ``perform`` writes only to the
database (anything that leaves it, a run's enqueue, goes through the engine's on-commit outbox) and
refuses an event it cannot act on with ``ActionRefused``, which rolls the acceptance back.

- ``workflow``: ``{"type": "workflow", "workflow": "<name>", "payload_from": "data"}`` starts a
  run with the JSON body (or the object at ``payload_from``, a dotted path; "" for the whole body)
  as its payload, and ``<source>:<event id>`` as its idempotency key.
- ``operation_outcome``: ``{"type": "operation_outcome", "system": "payments"}``; the body's
  ``data`` is the provider's record of one operation, ``{"key": <the ledger key>, "status":
  "succeeded" | "failed" | ..., ...}``, which settles it as reconcile would (``operation_report``).
- ``submission``: a message submitted to an agent. Not available yet (see ``SubmissionAction``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypedDict
from uuid import UUID

from ledger.adapters import Failed, Succeeded
from ledger.http import FAILED_STATES, PENDING_STATES
from ledger.services import operation_report
from workflows.exceptions import IdempotencyConflict, InvalidPayload, UnknownWorkflow
from workflows.registry import get_workflow
from workflows.services import run_start


class WorkflowAction(TypedDict):
    type: Literal["workflow"]
    workflow: str
    payload_from: str


class OperationOutcomeAction(TypedDict):
    type: Literal["operation_outcome"]
    system: str


class SubmissionAction(TypedDict):
    """The extension point for the agents app's submissions: a message submitted to the agent
    ``(account, kind, name)``, its text at ``text_from`` in the body, ``<source>:<event id>`` as
    its idempotency key. Once the agents' service is on this branch
    (``agents.submissions.submission_create(*, agent, user=None, messages, metadata,
    idempotency_key)``), ``_submission_perform`` finds the agent without a user (a webhook has
    none), calls it inside the accepting transaction and returns the submission in its result;
    ``_submission_problems`` checks the account and kind instead of refusing the type. A refusal
    for too many pending submissions should then be an answer the sender retries (429 or 503),
    not an ActionRefused (400). Nothing else here changes."""

    type: Literal["submission"]
    account: str
    kind: str
    name: str
    text_from: str


class ActionResult(TypedDict, total=False):
    """What the action did, stored on the delivery: a run it started, the operation it settled."""

    run_id: UUID
    operation_key: str
    result: dict[str, Any]


@dataclass(frozen=True)
class Event:
    source: str
    event_id: str
    body: Any  # the parsed JSON body


class ActionRefused(Exception):
    """The event cannot be acted on (its payload does not fit); nothing of it is kept."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def at_path(body: Any, path: str) -> Any:
    """The value at a dotted ``path`` of the body ("" is the body); ActionRefused if absent."""
    value = body
    for part in path.split(".") if path else []:
        if not isinstance(value, dict) or part not in value:
            raise ActionRefused("invalid_event", f"the event has no {path!r}")
        value = value[part]
    return value


# --- workflow -------------------------------------------------------------------------------------
def _workflow_problems(action: dict[str, Any]) -> list[str]:
    if not isinstance(action.get("workflow"), str):
        return ["a workflow action names its workflow"]
    if not isinstance(action.get("payload_from", ""), str):
        return ['payload_from must be a dotted path into the body, or "" for the whole body']
    try:
        get_workflow(action["workflow"])
    except UnknownWorkflow:
        return [f"no workflow {action['workflow']!r} is registered in this process"]
    return []


def _workflow_perform(action: dict[str, Any], event: Event) -> ActionResult:
    payload = at_path(event.body, action.get("payload_from", ""))
    if not isinstance(payload, dict):
        raise ActionRefused("invalid_event", "the payload for the workflow must be a JSON object")
    try:
        run, created = run_start(
            workflow=action["workflow"], payload=payload, idempotency_key=f"{event.source}:{event.event_id}"
        )
    except (InvalidPayload, IdempotencyConflict) as exc:  # PayloadTooLarge is an InvalidPayload
        raise ActionRefused(exc.code, str(exc)) from None
    return {"run_id": run.id, "result": {"run": str(run.id), "created": created}}


# --- operation_outcome ----------------------------------------------------------------------------
def _operation_problems(action: dict[str, Any]) -> list[str]:
    if not isinstance(action.get("system"), str) or not action["system"]:
        return ["an operation_outcome action names the ledger system its operations belong to"]
    return []


def _operation_perform(action: dict[str, Any], event: Event) -> ActionResult:
    record = at_path(event.body, "data")
    if not isinstance(record, dict) or not isinstance(record.get("key"), str) or not record["key"]:
        raise ActionRefused("invalid_event", "data must be the provider's record, with the operation's key")
    key, state = record["key"], str(record.get("status", "")).lower()
    outcome: Succeeded | Failed
    if state == "succeeded":
        outcome = Succeeded(response=record)
    elif state in FAILED_STATES:
        reason = record.get("reason") or record.get("failure_reason") or state
        outcome = Failed(reason=str(reason), detail=record)
    elif state in PENDING_STATES:
        return {"operation_key": key, "result": {"changed": False, "note": f"not final yet: {state}"}}
    else:
        raise ActionRefused("invalid_event", f"data.status {state!r} is not an outcome the ledger knows")
    report = operation_report(key=key, system=action["system"], outcome=outcome, reported_by=f"webhook {event.source}")
    if report is None:
        note = f"no operation of {action['system']} has this key"
        return {"operation_key": key, "result": {"changed": False, "note": note}}
    changed = report.before != report.after
    result = {"changed": changed, "before": report.before, "after": report.after, "note": report.note}
    return {"operation_key": key, "result": result}


# --- submission (not yet) -------------------------------------------------------------------------
def _submission_problems(action: dict[str, Any]) -> list[str]:
    return ["submission actions are not available yet (agents.services.submission_create is being built)"]


def _submission_perform(action: dict[str, Any], event: Event) -> ActionResult:
    raise NotImplementedError("submission actions are not available yet")


@dataclass(frozen=True)
class ActionType:
    problems: Callable[[dict[str, Any]], list[str]]
    perform: Callable[[dict[str, Any], Event], ActionResult]


ACTIONS: dict[str, ActionType] = {
    "workflow": ActionType(_workflow_problems, _workflow_perform),
    "operation_outcome": ActionType(_operation_problems, _operation_perform),
    "submission": ActionType(_submission_problems, _submission_perform),
}


def action_problems(action: Any) -> list[str]:
    if not isinstance(action, dict) or action.get("type") not in ACTIONS:
        return [f"action must be an object whose type is one of {', '.join(ACTIONS)}"]
    return [f"action: {problem}" for problem in ACTIONS[action["type"]].problems(action)]


def action_perform(action: dict[str, Any], event: Event) -> ActionResult:
    """Call inside atomic(), the accepted delivery inserted in the same transaction."""
    return ACTIONS[action["type"]].perform(action, event)
