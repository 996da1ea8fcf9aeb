"""``decide``, as DESIGN.md names it; thin over the service."""
from __future__ import annotations

from django.contrib.auth.models import AbstractUser, AnonymousUser

from approvals import services
from approvals.models import ApprovalRequest, DecisionChannel


def decide(
    request: ApprovalRequest | int, *, by: AbstractUser | AnonymousUser, approve: bool, version: str, note: str = "",
    channel: str = DecisionChannel.PYTHON,
) -> services.Decided:
    """Approve (``approve=True``) or reject ``version`` of the request as ``by``.

    Returns Decided (``created`` False for the same decision again); raises ApprovalRefused when
    DESIGN.md section 5's table refuses, and then nothing but the decision log changes.
    """
    request_id = request.pk if isinstance(request, ApprovalRequest) else int(request)
    return services.approval_decide(request_id=request_id, by=by, approve=approve, version=version, note=note,
                                    channel=channel)
