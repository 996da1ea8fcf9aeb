"""What an accepted event becomes: the source's ``action``, by its ``type``.

Each type has a check of its configuration (``problems``, run by the system check), a ``check``
of an event's shape that needs no database, and a ``perform`` that runs inside the transaction
that inserts the accepted delivery (a source that acts now) or marks it done (one that acts
later, in a worker): the event's effect and the row that records it commit together, or neither
does. ``perform`` writes only to the database (anything that leaves it, a run's enqueue, goes
through the engine's on-commit outbox) and refuses an event it cannot act on with
``ActionRefused``, which rolls its transaction back.

- ``workflow``: ``{"type": "workflow", "workflow": "<name>", "payload_from": "data"}`` starts a
  run with the JSON body (or the object at ``payload_from``, a dotted path; "" for the whole body)
  as its payload, and ``<source>:<event id>`` as its idempotency key.
- ``operation_outcome``: ``{"type": "operation_outcome", "system": "payments"}``; the body's
  ``data`` is the provider's record of one operation, ``{"key": <the ledger key>, "status":
  "succeeded" | "failed" | ..., ...}``, which settles it as reconcile would (``operation_report``).
- ``submission``: ``{"type": "submission", "account": "<slug>", "kind": "<agent kind>", "name":
  "<agent name>", "text_from": "data.text"}`` submits the string at ``text_from`` as one user
  message to the agent ``(account, kind, name)`` (created on first use), queued behind its other
  turns, with ``<source>:<event id>`` as the submission's idempotency key and the source, event id
  and the body's ``type`` as its metadata. An agent with AGENTS_MAX_PENDING_SUBMISSIONS pending is
  a 429 the sender retries (``ActionDeferred``), and so is an account that does not exist (yet): a
  503, since the fix is ours, and the sender's retry is then accepted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypedDict
from uuid import UUID

from agents.models import Submission
from agents.registry import get_agent_class
from agents.selectors import NAME_RULE, reachable_name
from agents.services import AgentUnavailable, TooManyQueuedTurns, agent_open
from agents.submissions import check_submission, submission_create
from ledger.adapters import Failed, Succeeded
from ledger.http import FAILED_STATES, PENDING_STATES
from ledger.services import operation_report
from workflows.exceptions import IdempotencyConflict, InvalidPayload, UnknownWorkflow
from workflows.models import WorkflowRun
from workflows.registry import get_workflow, internal_refusal
from workflows.services import run_start, validated_payload


class WorkflowAction(TypedDict):
    type: Literal["workflow"]
    workflow: str
    payload_from: str


class OperationOutcomeAction(TypedDict):
    type: Literal["operation_outcome"]
    system: str


class SubmissionAction(TypedDict):
    """A message submitted to the agent ``(account, kind, name)``: the text at ``text_from``."""

    type: Literal["submission"]
    account: str
    kind: str
    name: str
    text_from: str


class ActionResult(TypedDict, total=False):
    """What the action did, stored on the delivery: a run it started, the operation it settled,
    the submission it made."""

    run_id: UUID
    operation_key: str
    submission_id: UUID
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


class ActionDeferred(Exception):
    """The event cannot be acted on now, but may be later: nothing of it is kept, and the sender is
    told to try again (``status``: 429 for a full queue, 503 for something this side must fix)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


KEY_MAX = min(
    WorkflowRun._meta.get_field("idempotency_key").max_length or 0,
    Submission._meta.get_field("idempotency_key").max_length or 0,
)


def event_key(event: Event) -> str:
    """The idempotency key of what an event starts (a run, a submission): ``<source>:<event id>``,
    the event id hashed where that would not fit (a 100-character source name and a 200-character
    id are both allowed), so a long id is never refused for good."""
    key = f"{event.source}:{event.event_id}"
    if len(key) <= KEY_MAX:
        return key
    return f"{event.source}:sha256:{hashlib.sha256(event.event_id.encode()).hexdigest()}"


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
    refused = internal_refusal(action["workflow"], "a webhook source")
    return [refused] if refused else []


def _workflow_payload(action: dict[str, Any], event: Event) -> dict[str, Any]:
    payload = at_path(event.body, action.get("payload_from", ""))
    if not isinstance(payload, dict):
        raise ActionRefused("invalid_event", "the payload for the workflow must be a JSON object")
    return payload


def _workflow_check(action: dict[str, Any], event: Event) -> None:
    """The payload, and the workflow's own check of it (``validate_payload``, which needs no
    database), as ``run_start`` will make them."""
    try:
        validated_payload(get_workflow(action["workflow"]), _workflow_payload(action, event))
    except InvalidPayload as exc:  # PayloadTooLarge is an InvalidPayload
        raise ActionRefused(exc.code, str(exc)) from None


def _workflow_perform(action: dict[str, Any], event: Event) -> ActionResult:
    payload = _workflow_payload(action, event)
    try:
        run, created = run_start(workflow=action["workflow"], payload=payload, idempotency_key=event_key(event))
    except (InvalidPayload, IdempotencyConflict) as exc:  # PayloadTooLarge is an InvalidPayload
        raise ActionRefused(exc.code, str(exc)) from None
    return {"run_id": run.id, "result": {"run": str(run.id), "created": created}}


# --- operation_outcome ----------------------------------------------------------------------------
def _operation_problems(action: dict[str, Any]) -> list[str]:
    if not isinstance(action.get("system"), str) or not action["system"]:
        return ["an operation_outcome action names the ledger system its operations belong to"]
    return []


def _operation_record(action: dict[str, Any], event: Event) -> tuple[dict[str, Any], str]:
    """The provider's record of the operation, and its status in lower case."""
    record = at_path(event.body, "data")
    if not isinstance(record, dict) or not isinstance(record.get("key"), str) or not record["key"]:
        raise ActionRefused("invalid_event", "data must be the provider's record, with the operation's key")
    state = str(record.get("status", "")).lower()
    if state != "succeeded" and state not in FAILED_STATES and state not in PENDING_STATES:
        raise ActionRefused("invalid_event", f"data.status {state!r} is not an outcome the ledger knows")
    return record, state


def _operation_perform(action: dict[str, Any], event: Event) -> ActionResult:
    record, state = _operation_record(action, event)
    key = record["key"]
    outcome: Succeeded | Failed
    if state == "succeeded":
        outcome = Succeeded(response=record)
    elif state in FAILED_STATES:
        # A provider's failure_reason says why it failed; a bare "reason" may be the request's own
        # (the customer's reason for the refund), so it comes second.
        reason = record.get("failure_reason") or record.get("reason") or state
        outcome = Failed(reason=str(reason), detail=record)
    else:  # a pending state (_operation_record refuses the rest)
        return {"operation_key": key, "result": {"changed": False, "note": f"not final yet: {state}"}}
    report = operation_report(key=key, system=action["system"], outcome=outcome, reported_by=f"webhook {event.source}")
    if report is None:
        note = f"no operation of {action['system']} has this key"
        return {"operation_key": key, "result": {"changed": False, "note": note}}
    changed = report.before != report.after
    result = {"changed": changed, "before": report.before, "after": report.after, "note": report.note}
    return {"operation_key": key, "result": result}


# --- submission -----------------------------------------------------------------------------------
def _submission_problems(action: dict[str, Any]) -> list[str]:
    problems = [
        f"a submission action names the agent's {key} (a non-empty string)"
        for key in ("account", "kind", "name")
        if not isinstance(action.get(key), str) or not action[key]
    ]
    if not isinstance(action.get("text_from"), str):
        problems.append("text_from must be a dotted path into the body to the message's text, e.g. data.text")
    if problems:
        return problems
    if get_agent_class(action["kind"]) is None:
        problems.append(f"no agent kind {action['kind']!r} is registered in this process")
    if not reachable_name(action["name"]):
        problems.append(f"the agent's name must be {NAME_RULE}")
    return problems


def _submission_message(action: dict[str, Any], event: Event) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The submission's messages (one, the user's text) and metadata, checked as the API checks them."""
    text = at_path(event.body, action["text_from"])
    if not isinstance(text, str):
        raise ActionRefused("invalid_event", f"{action['text_from'] or 'the body'} must be the message's text")
    metadata: dict[str, Any] = {"webhook": event.source, "event_id": event.event_id}
    if isinstance(event.body, dict) and isinstance(event.body.get("type"), str):
        metadata["type"] = event.body["type"][:200]
    messages = [{"role": "user", "content": text}]
    try:
        check_submission(messages, metadata)
    except InvalidPayload as exc:
        raise ActionRefused(exc.code, str(exc)) from None
    return messages, metadata


def _submission_perform(action: dict[str, Any], event: Event) -> ActionResult:
    messages, metadata = _submission_message(action, event)  # before the agent is created
    try:
        agent = agent_open(account=action["account"], kind=action["kind"], name=action["name"])
        done = submission_create(
            agent=agent,
            user=None,
            messages=messages,
            metadata=metadata,
            idempotency_key=event_key(event),
            caller=f"webhook:{event.source}",
        )
    except AgentUnavailable as exc:
        raise ActionDeferred(503, "agent_unavailable", str(exc)) from None
    except TooManyQueuedTurns as exc:
        raise ActionDeferred(429, "too_many_pending", str(exc)) from None
    except (InvalidPayload, IdempotencyConflict) as exc:
        raise ActionRefused(exc.code, str(exc)) from None
    submission = done.submission
    result = {"submission": str(submission.pk), "agent": str(agent), "created": done.accepted}
    return {"submission_id": submission.pk, "result": result}


@dataclass(frozen=True)
class ActionType:
    problems: Callable[[dict[str, Any]], list[str]]
    # What of an event can be checked without the database (its shape, the workflow's own payload
    # check, a submission's message); perform makes the same checks.
    check: Callable[[dict[str, Any], Event], object]
    perform: Callable[[dict[str, Any], Event], ActionResult]


ACTIONS: dict[str, ActionType] = {
    "workflow": ActionType(_workflow_problems, _workflow_check, _workflow_perform),
    "operation_outcome": ActionType(_operation_problems, _operation_record, _operation_perform),
    "submission": ActionType(_submission_problems, _submission_message, _submission_perform),
}


def action_problems(action: Any) -> list[str]:
    if not isinstance(action, dict) or action.get("type") not in ACTIONS:
        return [f"action must be an object whose type is one of {', '.join(ACTIONS)}"]
    return [f"action: {problem}" for problem in ACTIONS[action["type"]].problems(action)]


def action_perform(action: dict[str, Any], event: Event) -> ActionResult:
    """Call inside atomic(), the accepted delivery inserted in the same transaction."""
    return ACTIONS[action["type"]].perform(action, event)


def action_check(action: dict[str, Any], event: Event) -> None:
    """ActionRefused if the event does not fit the action as far as that is known without the
    database (a source that acts later still refuses such an event before its 202)."""
    ACTIONS[action["type"]].check(action, event)
