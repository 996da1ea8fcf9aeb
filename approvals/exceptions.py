"""What approvals raise: to workflow code (rejected, expired) and to deciders (refused)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from approvals.types import ApprovalDecision


class ApprovalError(Exception):
    """Base class of the approvals errors."""


class ApprovalRejected(ApprovalError):
    """Raised into ``run()`` by ``wait_for_approval`` when the reviewer rejected the request.

    The same way on every replay (it is rebuilt from the stored decision event).
    """

    def __init__(self, decision: ApprovalDecision) -> None:
        # Neither the reviewer nor the note: this message can end up in the run's error, which its
        # owner reads (approvals.decision_details has them for staff and step bodies).
        super().__init__(f"approval request {decision.request_id} (version {decision.version}) was rejected")
        self.decision = decision


class ApprovalExpired(ApprovalError):
    """Raised into ``run()`` when nobody decided before the request's timeout."""

    def __init__(self, request_id: int, *, status: str = "expired") -> None:
        super().__init__(f"approval request {request_id} got no decision in time ({status})")
        self.request_id = request_id
        self.status = status


class ApprovalSuperseded(ApprovalError):
    """Raised into ``run()`` by ``wait_for_approval`` when the subject changed while the request was
    pending (``supersede_pending``). ``approve_current`` does not raise it: it asks again for the
    version that is current."""

    def __init__(self, request_id: int, *, version: str, current_version: str = "", reason: str = "") -> None:
        now = f" (now {current_version})" if current_version else ""
        why = f": {reason}" if reason else ""
        super().__init__(f"approval request {request_id} for version {version} was superseded{now}{why}")
        self.request_id = request_id
        self.version = version
        self.current_version = current_version
        self.reason = reason


class RefusalCode(StrEnum):
    """Why ``decide`` changed nothing. The API answers 403 for the first two, 409 for the rest."""

    NOT_AUTHORISED = "not_authorised"  # not in the approvers group and no approvals.decide_any
    FOUR_EYES = "four_eyes"  # the reviewer requested the action
    STALE_VERSION = "stale_version"  # the version sent is not the request's: review the current one
    NOT_PENDING = "not_pending"  # already decided, expired, superseded or cancelled (named)
    EXPIRED = "expired"  # past expires_at; the workflow's timer moves it to expired
    RUN_FINISHED = "run_finished"  # the run that waited for it has ended or was restarted


FORBIDDEN = frozenset({RefusalCode.NOT_AUTHORISED, RefusalCode.FOUR_EYES})


class ApprovalRefused(ApprovalError):
    """``decide`` refused: nothing changed (no transition, no event). ``status`` is the request's."""

    def __init__(
        self, code: RefusalCode, message: str, *, status: str, version: str, superseded_by: int | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.version = version
        self.superseded_by = superseded_by

    @property
    def detail(self) -> dict[str, Any]:
        return {"status": self.status, "version": self.version, "superseded_by": self.superseded_by}
