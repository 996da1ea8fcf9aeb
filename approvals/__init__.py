"""Versioned approval requests decided by people, waited for durably by workflows.

    from approvals import wait_for_approval, approve_current, decide, supersede_pending, decision_details
    from approvals import approved_content
    from approvals import ApprovalRejected, ApprovalExpired, ApprovalSuperseded, ApprovalRefused
    from approvals import ApprovalDecision, Proposal

The functions are imported lazily so that importing this package does not need Django's app
registry to be ready (workflow modules import it at app-loading time).
"""

from typing import TYPE_CHECKING, Any

from approvals.exceptions import (
    ApprovalError,
    ApprovalExpired,
    ApprovalRefused,
    ApprovalRejected,
    ApprovalSuperseded,
    RefusalCode,
)
from approvals.types import ApprovalDecision, Proposal

if TYPE_CHECKING:  # what __getattr__ below returns, for the type checker ("as": exported)
    from approvals.public import approved_content as approved_content
    from approvals.public import decide as decide
    from approvals.public import decision_details as decision_details
    from approvals.public import supersede_pending as supersede_pending
    from approvals.waits import approve_current as approve_current
    from approvals.waits import wait_for_approval as wait_for_approval

_WAITS = ("wait_for_approval", "approve_current")
_PUBLIC = ("decide", "supersede_pending", "decision_details", "approved_content")

__all__ = [
    "ApprovalDecision",
    "ApprovalError",
    "ApprovalExpired",
    "ApprovalRefused",
    "ApprovalRejected",
    "ApprovalSuperseded",
    "Proposal",
    "RefusalCode",
    *_WAITS,
    *_PUBLIC,
]


def __getattr__(name: str) -> Any:
    if name in _WAITS:
        from approvals import waits

        return getattr(waits, name)
    if name in _PUBLIC:
        from approvals import public

        return getattr(public, name)
    raise AttributeError(f"module 'approvals' has no attribute {name!r}")
