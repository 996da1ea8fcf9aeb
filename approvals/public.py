"""``decide`` and ``supersede_pending`` for other apps (docs/architecture.md#approvals); thin over the services."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractUser, AnonymousUser

from approvals import services
from approvals.models import ApprovalRequest, DecisionChannel
from approvals.selectors import DecisionDetails
from approvals.selectors import approved_content as _approved_content
from approvals.selectors import decision_details as _decision_details
from approvals.services import Subject


def decide(
    request: ApprovalRequest | int,
    *,
    by: AbstractUser | AnonymousUser,
    approve: bool,
    version: str,
    note: str = "",
    channel: str = DecisionChannel.PYTHON,
) -> services.Decided:
    """Approve (``approve=True``) or reject ``version`` of the request as ``by``.

    Returns Decided (``created`` False for the same decision again); raises ApprovalRefused when
    a check of ``services.check_decision`` refuses, and then nothing but the decision log changes.
    """
    request_id = request.pk if isinstance(request, ApprovalRequest) else int(request)
    return services.approval_decide(
        request_id=request_id, by=by, approve=approve, version=version, note=note, channel=channel
    )


def supersede_pending(subject: Subject, *, reason: str = "", current_version: str = "") -> list[int]:
    """The subject changed: its pending requests are superseded now, and the runs that wait for
    them are woken to ask again for the current version (``approve_current``).

    Call inside the transaction that changes the subject. ``subject`` as for ``wait_for_approval``;
    ``reason`` (e.g. "source sanctions revised") goes to the decision log and the run. Returns the
    ids of the requests superseded. A decision on one of them is then refused ("the request is
    superseded"), naming its replacement once the workflow has raised it.
    """
    return services.approval_supersede_pending(
        subject=services.subject_ref(subject), reason=reason, current_version=current_version
    )


def decision_details(request: ApprovalRequest | int) -> DecisionDetails:
    """Who decided the request and their note, for a step body that acts on them (recording the
    reviewer on the subject). Keep them out of the step's result: the run's owner reads it."""
    return _decision_details(request.pk if isinstance(request, ApprovalRequest) else int(request))


def approved_content(request: ApprovalRequest | int) -> dict[str, Any]:
    """The snapshot the reviewer approved (the request's ``content``): act on this, not on a later
    read of the subject, which may have changed since (LookupError unless it was approved)."""
    return _approved_content(request.pk if isinstance(request, ApprovalRequest) else int(request))
