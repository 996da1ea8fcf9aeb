"""The demo workflow: onboarding a customer, slow enough to watch in the admin and on the run page.

``demo.onboarding`` payload (a JSON object, every key optional):

    customer                  str    who is onboarded ("alice")
    plan                      str    "starter" | "team" | ... ("starter")
    work_seconds              float  how long each working step takes (0.7; real work is a sleep here)
    settle_seconds            float  the durable sleep between provisioning and approval (3)
    approval_timeout_seconds  float  how long to wait for an "approve" event (600)

It creates an account, provisions a workspace, imports sample data (reporting progress after each),
sleeps durably, then waits for an ``approve`` event, e.g.

    manage.py workflows send-event <run id> approve --payload '{"by": "admin"}'

Without one before the timeout it carries on unapproved (WaitTimeout is caught, not fatal), and
finally sends a welcome. The result says which of the two happened.
"""
from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from workflows import WaitTimeout, Workflow, workflow
from workflows.registry import Event

if TYPE_CHECKING:
    from workflows.engine import Step

# (step name, stage shown in progress); the step bodies stand in for calls to other systems.
WORK = [
    ("create account", "account created"),
    ("provision workspace", "workspace ready"),
    ("import sample data", "sample data imported"),
]
TOTAL = len(WORK) + 3  # the working steps, the settle sleep, the approval, the welcome


def do_work(stage: str, customer: str, plan: str, seconds: float) -> dict[str, Any]:
    """One unit of short real work; returns what a real call would record."""
    time.sleep(seconds)
    return {"stage": stage, "customer": customer, "plan": plan, "at": time.time()}


def send_welcome(customer: str, approved_by: str | None) -> dict[str, Any]:
    time.sleep(0.5)
    return {"to": customer, "template": "welcome" if approved_by else "welcome-pending-review"}


@workflow("demo.onboarding")
class Onboarding(Workflow):
    version = "1"

    def run(self, event: Event, step: Step) -> dict[str, Any]:
        p = event.payload
        customer, plan = str(p.get("customer", "alice")), str(p.get("plan", "starter"))
        seconds = float(p.get("work_seconds", 0.7))
        done = 0
        # Progress is best effort and repeats on replay: run() reaches these lines again each time
        # the run advances, which is harmless for a progress bar.
        for name, stage in WORK:
            step.do(name, do_work, stage, customer, plan, seconds)
            done += 1
            self.report_progress({"done": done, "total": TOTAL, "stage": stage})

        step.sleep("let the workspace settle", timedelta(seconds=float(p.get("settle_seconds", 3))))
        done += 1
        self.report_progress({"done": done, "total": TOTAL, "stage": "settled; awaiting approval"})

        timeout = timedelta(seconds=float(p.get("approval_timeout_seconds", 600)))
        try:
            approval = step.wait_for_event("wait for approval", type="approve", timeout=timeout)
            approved_by: str | None = str(approval.get("by", "someone")) if isinstance(approval, dict) else "someone"
        except WaitTimeout:
            approved_by = None  # no approval in time: carry on, flagged for review
        done += 1
        self.report_progress({"done": done, "total": TOTAL,
                              "stage": f"approved by {approved_by}" if approved_by else "approval timed out"})

        welcome = step.do("send welcome", send_welcome, customer, approved_by)
        done += 1
        self.report_progress({"done": done, "total": TOTAL, "stage": "done"})
        return {"customer": customer, "plan": plan, "approved": approved_by is not None,
                "approved_by": approved_by, "welcome": welcome}
