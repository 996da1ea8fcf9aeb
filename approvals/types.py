"""What the approvals API hands back: plain dataclasses, importable before Django is ready."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Proposal:
    """One version of a subject as a reviewer sees it: what ``approve_current``'s ``load`` returns.

    ``load`` may also return the tuple ``(version, content, summary)``.
    """

    version: str
    content: Any = None
    summary: str = ""

    @classmethod
    def of(cls, value: Proposal | tuple[Any, ...] | Mapping[str, Any]) -> Proposal:
        if isinstance(value, Proposal):
            proposal = value
        elif isinstance(value, tuple) and len(value) == 3:
            proposal = cls(version=value[0], content=value[1], summary=value[2])
        elif isinstance(value, Mapping):
            proposal = cls(version=value["version"], content=value.get("content"), summary=value.get("summary", ""))
        else:
            raise TypeError(f"load() must return a Proposal or (version, content, summary), not {value!r}")
        if not isinstance(proposal.version, str) or not proposal.version:
            raise TypeError(f"a proposal's version must be a non-empty string, not {proposal.version!r}")
        if not isinstance(proposal.summary, str):
            raise TypeError(f"a proposal's summary must be a string, not {proposal.summary!r}")
        return proposal


@dataclass(frozen=True)
class ApprovalDecision:
    """A decision, as the workflow sees it (built from the decision event's payload): what was
    decided on which version, never by whom or why, since the run's owner reads its steps. A step
    that must act on the reviewer reads ``approvals.decision_details(request_id)`` in its body."""

    request_id: int
    approved: bool
    version: str
    decided_at: str

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> ApprovalDecision:
        return cls(
            request_id=int(payload["request_id"]),
            approved=bool(payload["approved"]),
            version=str(payload["version"]),
            decided_at=str(payload.get("decided_at") or ""),
        )
