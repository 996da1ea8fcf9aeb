"""The workflow side: wait for a human decision on one version of a subject, durably.

``wait_for_approval`` is three durable steps:

1. ``"<name>: request"`` (atomic): creates the pending ApprovalRequest; the row and the step's
   result (its id) commit together, so a replay never raises a second request.
2. ``"<name>: decision"``: ``step.wait_for_event(type="approval:<id>")`` until the request's
   ``expires_at``. ``decide()`` sends that event in the transaction that approves or rejects.
3. only on timeout, ``"<name>: expire"`` (atomic): moves the request to expired, unless a decision
   won the race with the timer, in which case the decision stands.

``approve_current`` adds ``"<name>: re-check"`` after an approval and loops (the engine numbers the
repeated names ``#2``, ``#3``): approval is only returned for the version that is current. It also
loops, without a re-check, when the subject changed while the request was pending and the change
superseded it at once (``supersede_pending``, which wakes the wait with a supersession event).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from approvals import services
from approvals.exceptions import ApprovalExpired, ApprovalRejected, ApprovalSuperseded
from approvals.models import ApprovalStatus
from approvals.services import CreatedRequest, Expiry, Recheck, Subject
from approvals.types import ApprovalDecision, Proposal
from workflows import NonRetryableError, WaitTimeout
from workflows.exceptions import InvalidPayload

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

    from workflows.engine import Step

Load = Callable[[], Proposal | tuple[Any, ...] | Mapping[str, Any]]
Check = Callable[[Proposal], object]
DEFAULT_TIMEOUT = timedelta(hours=48)


def wait_for_approval(
    step: Step,
    *,
    name: str,
    subject: Subject,
    version: str,
    summary: str,
    approvers: str,
    timeout: timedelta | float = DEFAULT_TIMEOUT,
    content: Any = None,
    requested_by: AbstractBaseUser | int | None = None,
) -> ApprovalDecision:
    """Ask the ``approvers`` group to decide on ``version`` of ``subject``; return the approval.

    ``subject`` is a saved model instance (named ``app_label.model`` + pk) or a ``(type, id)`` pair.
    ``content`` (JSON) is the snapshot reviewers see; ``summary`` the proposed consequence in words.
    ``requested_by`` (a user or id) may not decide it (four eyes); None for a request of the system.
    Raises ApprovalRejected, ApprovalExpired (after ``timeout``), or ApprovalSuperseded (the
    subject changed while pending: ``supersede_pending``), the same way on every replay.
    """
    proposal = Proposal(version=version, content=content, summary=summary)
    fixed: Load = lambda: proposal
    created = _request(
        step, name=name, subject=subject, load=fixed, approvers=approvers, timeout=timeout, requested_by=requested_by
    )
    return _decision(step, name=name, created=created)


def approve_current(
    step: Step,
    *,
    name: str,
    subject: Subject,
    load: Load,
    approvers: str,
    timeout: timedelta | float = DEFAULT_TIMEOUT,
    requested_by: AbstractBaseUser | int | None = None,
    check: Check | None = None,
) -> ApprovalDecision:
    """Get an approval of the subject's version that is still current after the approval.

    ``load()`` reads the subject and returns ``Proposal(version, content, summary)`` or the tuple
    ``(version, content, summary)``; it is called inside steps (keep it a quick database read).
    Each round raises a request for what ``load`` returns, waits for the decision, then re-reads:
    if the version changed meanwhile, the approved request is superseded and a new one raised for
    the new version. A request superseded while pending (the code that changed the subject called
    ``supersede_pending``) is replaced the same way, without waiting for a decision on it.
    Returns the approval of the current version; raises ApprovalRejected or ApprovalExpired as
    ``wait_for_approval`` does.

    ``check(proposal)``, if given, is called in the step that raises each request, before it is
    stored: it raises a NonRetryableError where nobody should be asked (the subject changed so that
    the action is no longer possible, say), and that step's StepError ends the approval with no
    request left pending. Without it, a subject changed while its request was pending is asked
    about again whatever it has become.
    """
    replaces: int | None = None
    while True:
        created = _request(
            step,
            name=name,
            subject=subject,
            load=load,
            approvers=approvers,
            timeout=timeout,
            requested_by=requested_by,
            replaces=replaces,
            check=check,
        )
        try:
            decision = _decision(step, name=name, created=created)
        except ApprovalSuperseded:
            replaces = created["request_id"]
            continue
        recheck: Recheck = step.do(f"{name}: re-check", _recheck, decision.request_id, load, atomic=True)
        if not recheck["changed"]:
            return decision
        replaces = decision.request_id


# --- the steps --------------------------------------------------------------------------------------
def _request(
    step: Step,
    *,
    name: str,
    subject: Subject,
    load: Load,
    approvers: str,
    timeout: timedelta | float,
    requested_by: AbstractBaseUser | int | None,
    replaces: int | None = None,
    check: Check | None = None,
) -> CreatedRequest:
    # Checked outside the step, on every replay: bad arguments fail the run at once with a clear
    # error instead of being retried as if the database had hiccupped.
    subject_pair = services.subject_ref(subject)
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if seconds <= 0:
        raise ValueError(f"approval {name!r}: the timeout must be positive, not {timeout!r}")
    requested_by_id = requested_by if isinstance(requested_by, int) or requested_by is None else requested_by.pk
    run_id, attempt = _run_of(step)
    created: CreatedRequest = step.do(
        f"{name}: request",
        _create,
        run_id,
        attempt,
        name,
        subject_pair,
        load,
        approvers,
        seconds,
        requested_by_id,
        replaces,
        check,
        atomic=True,
    )
    return created


def _create(
    run_id: str,
    attempt: int,
    name: str,
    subject: tuple[str, str],
    load: Load,
    approvers: str,
    seconds: float,
    requested_by_id: int | None,
    replaces: int | None,
    check: Check | None = None,
) -> CreatedRequest:
    loaded = load()
    try:
        proposal = Proposal.of(loaded)
        if check is not None:
            check(proposal)  # its refusal is the step's error, before anything is stored
        request = services.approval_request_create(
            run_id=run_id,
            attempt=attempt,
            step_name=name,
            subject=subject,
            proposal=proposal,
            approvers=approvers,
            timeout=timedelta(seconds=seconds),
            requested_by_id=requested_by_id,
            replaces_id=replaces,
        )
    except (TypeError, ValueError, InvalidPayload) as exc:
        raise NonRetryableError(f"approval {name!r}: {exc}") from exc  # the same input fails every try
    return {"request_id": request.pk, "version": request.version, "expires_at": request.expires_at.isoformat()}


def _decision(step: Step, *, name: str, created: CreatedRequest) -> ApprovalDecision:
    request_id = created["request_id"]
    # The wait's timer is set once, when the wait step is first stored. Aimed at the request's own
    # expires_at (it lands a few milliseconds after it, never before), it fires when decide() starts
    # refusing, however late the wait was reached. On replay the stored timer rules and this is unused.
    remaining = (datetime.fromisoformat(created["expires_at"]) - timezone.now()).total_seconds()
    try:
        payload = step.wait_for_event(f"{name}: decision", type=f"approval:{request_id}", timeout=max(remaining, 0.0))
    except WaitTimeout:
        expiry: Expiry = step.do(f"{name}: expire", _expire, request_id, atomic=True)
        if expiry["status"] == ApprovalStatus.SUPERSEDED:  # superseded just as the timer fired
            raise ApprovalSuperseded(request_id, version=created["version"]) from None
        if expiry["decision"] is None:
            raise ApprovalExpired(request_id, status=expiry["status"]) from None
        payload = expiry["decision"]  # decided just as the timer fired: the decision stands
    if payload.get("superseded"):
        raise ApprovalSuperseded(
            request_id,
            version=str(payload.get("version", created["version"])),
            current_version=str(payload.get("current_version", "")),
            reason=str(payload.get("reason", "")),
        )
    decision = ApprovalDecision.from_payload(payload)
    if not decision.approved:
        raise ApprovalRejected(decision)
    return decision


def _expire(request_id: int) -> Expiry:
    return services.approval_expire(request_id=request_id)


def _recheck(request_id: int, load: Load) -> Recheck:
    try:
        current = Proposal.of(load())
    except TypeError as exc:
        raise NonRetryableError(str(exc)) from exc
    return services.approval_recheck(request_id=request_id, current=current)


def _run_of(step: Step) -> tuple[str, int]:
    """The run and attempt the step belongs to."""
    return str(step.run_id), step.attempt
