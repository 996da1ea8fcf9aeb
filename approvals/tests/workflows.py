"""Workflows the approvals tests run in real worker processes (loaded through WORKFLOWS_MODULES).

The subject of ``approvals.test.current`` is a JSON file named in the payload, so a test in
another process can change it while the run waits.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

from approvals import (
    ApprovalExpired,
    ApprovalRejected,
    ApprovalSuperseded,
    Proposal,
    approve_current,
    wait_for_approval,
)
from workflows import Workflow, workflow
from workflows.registry import Event


def acted(request_id: int) -> str:
    return f"acted on approval {request_id}"


def who_decided(request_id: int) -> Any:
    from approvals import decision_details

    return decision_details(request_id)


@workflow("approvals.test.simple")
class Simple(Workflow):
    """One approval of a fixed version; the outcome is the run's result."""

    def run(self, event: Event, step: Any) -> Any:
        p = event.payload
        try:
            decision = wait_for_approval(
                step,
                name="refund approval",
                subject=("shop.order", p.get("order", 1042)),
                version=p.get("version", "v1"),
                summary=p.get("summary", "Refund £120 on order 1042"),
                approvers=p["approvers"],
                timeout=p.get("timeout", 120),
                content=p.get("content"),
                requested_by=p.get("requested_by"),
            )
        except ApprovalRejected as exc:
            # A test workflow may read who decided (staff data) and return it; real ones keep it out.
            who = step.do("who decided", who_decided, exc.decision.request_id)
            return {"outcome": "rejected", "by": who["decided_by"], "note": who["note"]}
        except ApprovalExpired as exc:
            return {"outcome": "expired", "request": exc.request_id}
        except ApprovalSuperseded as exc:
            return {
                "outcome": "superseded",
                "request": exc.request_id,
                "version": exc.version,
                "current_version": exc.current_version,
                "reason": exc.reason,
            }
        done = step.do("act", acted, decision.request_id)
        who = step.do("who decided", who_decided, decision.request_id)
        return {
            "outcome": "approved",
            "by": who["decided_by"],
            "version": decision.version,
            "request": decision.request_id,
            "note": who["note"],
            "done": done,
        }


def read_document(path: str) -> Proposal:
    data = json.loads(Path(path).read_text())
    return Proposal(version=str(data["version"]), content=data, summary=f"Publish {data['title']}")


@workflow("approvals.test.current")
class Current(Workflow):
    """Approval of whatever version of the document is current once approved."""

    def run(self, event: Event, step: Any) -> Any:
        p = event.payload
        decision = approve_current(
            step,
            name="review",
            subject=("test.document", "doc-1"),
            load=partial(read_document, p["path"]),
            approvers=p["approvers"],
            timeout=p.get("timeout", 120),
        )
        who = step.do("who decided", who_decided, decision.request_id)
        return {"version": decision.version, "request": decision.request_id, "by": who["decided_by"]}
