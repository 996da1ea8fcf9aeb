"""The demo workflow: onboarding a customer, slow enough to watch in the admin and on the run page.

``demo.onboarding`` is public: anyone signed in may start it (``POST /api/workflows/demo.onboarding/runs``),
so ``validate_payload`` bounds every input. Payload (a JSON object, every key optional):

    customer                  str    who is onboarded (the run's owner), at most 100 characters
    plan                      str    "starter" | "team" | ... ("starter"), at most 100 characters
    work_seconds              float  how long each working step takes, 0 to 10 (0.7; real work is a sleep)
    settle_seconds            float  the durable sleep between provisioning and approval, 0 to 600 (3)
    approval_timeout_seconds  float  how long to wait for the approval, 1 s to 7 days (600)

It creates an account, provisions a workspace, imports sample data (reporting progress after each),
sleeps durably, then asks the ``onboarding-approvers`` group for an approval (a real approval
request, decided in the admin or with ``POST /api/approvals/<id>/decision``; whoever started the
run may not decide it). Without a decision before the timeout it carries on unapproved; a
rejection ends it without a welcome. The result says which happened.
"""

from __future__ import annotations

import math
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from approvals import ApprovalExpired, ApprovalRejected, wait_for_approval
from workflows import Workflow, workflow
from workflows.exceptions import InvalidPayload
from workflows.registry import Event

if TYPE_CHECKING:
    from workflows.engine import Step

APPROVERS = "onboarding-approvers"
# (step name, stage shown in progress); the step bodies stand in for calls to other systems.
WORK = [
    ("create account", "account created"),
    ("provision workspace", "workspace ready"),
    ("import sample data", "sample data imported"),
]
TOTAL = len(WORK) + 3  # the working steps, the settle sleep, the approval, the welcome
# key: (default, lowest, highest) for numbers; the strings are checked apart.
NUMBERS = {
    "work_seconds": (0.7, 0.0, 10.0),
    "settle_seconds": (3.0, 0.0, 600.0),
    "approval_timeout_seconds": (600.0, 1.0, 7 * 24 * 3600.0),
}
TEXTS = {"customer": "alice", "plan": "starter"}  # (customer: the run's owner when not given)


def do_work(stage: str, customer: str, plan: str, seconds: float) -> dict[str, Any]:
    """One unit of short real work; returns what a real call would record."""
    time.sleep(seconds)
    return {"stage": stage, "customer": customer, "plan": plan, "at": time.time()}


def send_welcome(customer: str, approved: bool) -> dict[str, Any]:
    time.sleep(0.5)
    return {"to": customer, "template": "welcome" if approved else "welcome-pending-review"}


def username_of(user_id: int | None) -> str:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.filter(pk=user_id).first() if user_id is not None else None
    return user.get_username() if user is not None else "a customer"


def _number(payload: dict[str, Any], key: str) -> float:
    default, low, high = NUMBERS[key]
    value = payload.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not _finite(value):
        raise InvalidPayload(f"{key} must be a number of seconds")
    if not low <= value <= high:
        raise InvalidPayload(f"{key} must be between {low:g} and {high:g} seconds, not {value:g}")
    return float(value)


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float (JSON allows 400 digits)
        return False


@workflow("demo.onboarding", public=True)
class Onboarding(Workflow):
    version = "2"
    # What validate_payload checks, for the API's schema (tests/test_fuzz_api.py holds them to agreeing).
    payload_schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            **{
                key: {"type": "string", "minLength": 1, "maxLength": 100, "pattern": "^[^\\x00]*$", "default": default}
                for key, default in TEXTS.items()
            },
            **{
                key: {"type": "number", "minimum": low, "maximum": high, "default": default}
                for key, (default, low, high) in NUMBERS.items()
            },
        },
    }

    @classmethod
    def validate_payload(cls, payload: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(payload) - set(NUMBERS) - set(TEXTS))
        if unknown:
            raise InvalidPayload(f"unknown payload keys: {', '.join(unknown)}")
        for key in TEXTS:
            value = payload.get(key, TEXTS[key])
            if not isinstance(value, str) or not 0 < len(value) <= 100:
                raise InvalidPayload(f"{key} must be a string of 1 to 100 characters")
        for key in NUMBERS:
            _number(payload, key)
        return payload

    def run(self, event: Event, step: Step) -> dict[str, Any]:
        p = event.payload
        plan = str(p.get("plan", TEXTS["plan"]))
        # Who is onboarded: as given, else whoever started the run (its reviewers see the name).
        customer = str(p["customer"]) if "customer" in p else step.do("who is onboarded", username_of, event.owner_id)
        seconds = _number(p, "work_seconds")
        done = 0
        # Progress is best effort and repeats on replay: run() reaches these lines again each time
        # the run advances, which is harmless for a progress bar.
        for name, stage in WORK:
            step.do(name, do_work, stage, customer, plan, seconds)
            done += 1
            self.report_progress({"done": done, "total": TOTAL, "stage": stage})

        step.sleep("let the workspace settle", timedelta(seconds=_number(p, "settle_seconds")))
        done += 1
        self.report_progress({"done": done, "total": TOTAL, "stage": "settled; awaiting approval"})

        approval: int | None = None  # the request approved; who decided is staff data, not the run's
        try:
            decision = wait_for_approval(
                step,
                name="onboarding approval",
                subject=("demo.onboarding", str(event.run_id)),
                version="1",
                summary=f"Onboard {customer} on the {plan} plan",
                approvers=APPROVERS,
                timeout=_number(p, "approval_timeout_seconds"),
                content={"customer": customer, "plan": plan},
                requested_by=event.owner_id,  # whoever started it may not approve it
            )
            approval = decision.request_id
        except ApprovalRejected as rejected:
            self.report_progress({"done": TOTAL, "total": TOTAL, "stage": "rejected"})
            return {
                "customer": customer,
                "plan": plan,
                "approved": False,
                "rejected": True,
                "approval_request": rejected.decision.request_id,
            }
        except ApprovalExpired:
            pass  # no decision in time: carry on, flagged for review
        done += 1
        self.report_progress({"done": done, "total": TOTAL, "stage": "approved" if approval else "approval timed out"})

        welcome = step.do("send welcome", send_welcome, customer, approval is not None)
        done += 1
        self.report_progress({"done": done, "total": TOTAL, "stage": "done"})
        return {
            "customer": customer,
            "plan": plan,
            "approved": approval is not None,
            "approval_request": approval,
            "welcome": welcome,
        }
