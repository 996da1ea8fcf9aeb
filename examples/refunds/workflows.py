"""The refund process (docs/architecture.md#the-examples): check, approve above a limit, refund once, record.

Payload: ``{"request_id": int, "order": str}`` plus optional waits for tests and demos:
``approval_timeout_seconds`` (48 h), ``retry_delay_seconds`` (2 s, the refund step's first
backoff) and ``check_interval_seconds`` (10 min between outcome checks once it is unknown), and
``agent`` (an agent's id) for a request asked for in a chat.

A run that names an agent tells that chat each state the customer cares about, in words (awaiting
approval, submitted, outcome being checked, then confirmed, rejected, expired or could not be
completed), each by an atomic step (``examples.chat.tell_chat``): exactly once, whatever replays.
A run without an agent takes none of those steps, so runs started before they existed replay as
they were recorded.

The refund goes through ``ledger.perform`` with one key per request, so no retry, replay or
recovered worker can refund twice; right before it, ``refund_reserve`` checks the order's balance
again under its row lock and records the operation, so no two requests pay the same money. A
refund whose outcome stays unknown after the step's retries is checked again every interval
(``perform`` answers from storage once ``manage.py reconcile`` or a person resolved it, or looks
it up itself), at most MAX_CHECKS times.

Personal data stays out of the run: step results and the approval hold ids, amounts and what a
reviewer decides on, never the shipping address.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from functools import partial
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

import approvals
from approvals import ApprovalExpired, ApprovalRejected, Proposal, approve_current
from examples.chat import agent_of, tell_chat
from examples.refunds.models import Order, RefundRequest, operation_key
from examples.refunds.selectors import (
    AWAITING_APPROVAL,
    BEING_CHECKED,
    CONFIRMED,
    EXPIRED,
    NOT_COMPLETED,
    REJECTED,
    SUBMITTED,
    needs_approval,
    order_balance,
)
from examples.refunds.services import (
    OPTIONS,
    REFUND_TOOL,
    RefundRefused,
    refund_mark_recorded,
    refund_record_id,
    refund_recorded,
    refund_reserve,
)
from ledger import (
    OperationFailed,
    OperationInProgress,
    OutcomeUnknown,
    ProviderUnavailable,
    perform,
    record_create,
    wait_for_outcome,
)
from ledger.models import ExternalOperation
from workflows import NonRetryableError, Retries, StepError, StepTimeout, Workflow, current_step, workflow
from workflows.exceptions import InvalidPayload, check_ids
from workflows.registry import Event

if TYPE_CHECKING:
    from workflows.engine import Step

APPROVERS = "refund-approvers"
APPROVAL_TIMEOUT = timedelta(hours=48)
CHECK_INTERVAL = timedelta(minutes=10)
# Versions whose runs slept between checks (their recorded steps are sleeps; see Refund.version).
SLEEPING_VERSIONS = frozenset({"1", "2", "3"})
MAX_CHECKS = 144  # a day of checks at the default interval, then the run fails and staff take over
# Step errors that leave the refund possibly done: never a new refund, only checks of this key.
UNSETTLED = frozenset(e.__name__ for e in (OutcomeUnknown, OperationInProgress, ProviderUnavailable, StepTimeout))
CURRENCY_SIGNS = {"GBP": "£", "EUR": "€", "USD": "$"}
# What the customer's chat is told when the run ends, by its outcome.
OUTCOME_WORDS = {"refunded": CONFIRMED, "rejected": REJECTED, "expired": EXPIRED, "failed": NOT_COMPLETED}


@workflow("refund")
class Refund(Workflow):
    """Not public: ``refund_request_create`` starts it, for the order's customer only."""

    # 3: runs that name an agent tell its chat their states (steps "tell the chat: <status>"). The
    # engine replays any version with today's code; runs in flight name no agent, so take no new step.
    # 4: between checks of an unknown outcome the run waits to be woken by whoever settles it (a
    # webhook, reconcile, a person) instead of sleeping the whole interval; runs started at 3 or
    # before keep their sleeps (``await_outcome``).
    version = "4"

    @classmethod
    def validate_payload(cls, payload: dict[str, Any]) -> dict[str, Any]:
        check_ids(payload, "request_id")
        if not isinstance(payload.get("order"), str):
            raise InvalidPayload("order must be the order's number")
        if "agent" in payload and agent_of(payload) is None:
            raise InvalidPayload("agent must be an agent's id")
        unknown = sorted(set(payload) - {"request_id", "order", "agent"} - OPTIONS)
        if unknown:
            raise InvalidPayload(f"unknown payload keys: {', '.join(unknown)}")
        for key in OPTIONS & set(payload):
            value = payload[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 7 * 24 * 3600:
                raise InvalidPayload(f"{key} must be a number of seconds up to a week")
        return payload

    def run(self, event: Event, step: Step) -> dict[str, Any]:
        snapshot: dict[str, Any] = step.do("load order", load_snapshot, int(event.payload["request_id"]))
        result = self.refund(event, step, snapshot)
        self.tell(step, event, snapshot, OUTCOME_WORDS.get(result["outcome"], NOT_COMPLETED))
        return result

    def tell(self, step: Step, event: Event, snapshot: dict[str, Any], status: str) -> None:
        """Tell the chat the request was asked in (if any) its new status, once."""
        entry = {
            "order": snapshot["order"],
            "amount": snapshot["refund_amount"],
            "currency": snapshot["currency"],
            "status": status,
        }
        tell_chat(step, agent_of(event.payload), "refunds", str(snapshot["request_id"]), entry)

    def refund(self, event: Event, step: Step, snapshot: dict[str, Any]) -> dict[str, Any]:
        """Decide, ask for an approval when needed, and pay: the run's outcome."""
        payload = event.payload
        request_id = int(payload["request_id"])
        # A snapshot stored before requests had a salt is of a request without one.
        key = snapshot.get("operation_key") or operation_key(snapshot["order"], request_id, "")
        # A restarted run whose earlier attempt reserved (and perhaps sent) this request's refund
        # continues that operation: the money is already committed, so it is neither checked nor
        # approved again; perform answers from storage, or sends or looks up the key as it stands.
        earlier: dict[str, Any] | None = step.do("find an earlier refund", earlier_refund, key)
        if earlier is not None:
            return self.pay(step, event, snapshot, key, earlier["request"])
        if (refused := self.refused_by_policy(step, "check policy", snapshot)) is not None:
            return refused
        if snapshot["needs_approval"]:
            timeout = float(payload.get("approval_timeout_seconds") or APPROVAL_TIMEOUT.total_seconds())
            self.report_progress({"stage": "awaiting approval"})
            self.tell(step, event, snapshot, AWAITING_APPROVAL)
            try:
                decision = approve_current(
                    step,
                    name="refund approval",
                    subject=("refunds.order", snapshot["order_id"]),
                    load=partial(order_proposal, request_id),
                    approvers=APPROVERS,
                    timeout=timeout,
                    requested_by=snapshot["customer_id"],  # four eyes: never approved by who asked
                    # An order changed while its approval was pending is asked about again, unless
                    # it can no longer refund the amount: nobody is asked to approve what cannot be paid.
                    check=check_proposal,
                )
            except StepError as exc:
                if exc.error_type != RefundRefused.__name__:
                    raise
                return {"outcome": "failed", "request_id": request_id, "reason": exc.message}
            except ApprovalRejected:
                return {"outcome": "rejected", "request_id": request_id}
            except ApprovalExpired:
                return {"outcome": "expired", "request_id": request_id}
            # Pay exactly what was approved: the approved snapshot's order, amount and currency, not a
            # later read's (the order may change between approve_current's re-check and here).
            # refund_reserve refuses it, under the order's lock, if the order no longer matches.
            approved = step.do("approved refund", approved_body, decision.request_id)
            snapshot = step.do("reload order", load_snapshot, request_id)
            if (refused := self.refused_by_policy(step, "re-check policy", snapshot)) is not None:
                return refused
            return self.pay(step, event, snapshot, key, approved)
        return self.pay(step, event, snapshot, key, refund_body(snapshot))

    def pay(
        self, step: Step, event: Event, snapshot: dict[str, Any], key: str, request: dict[str, Any]
    ) -> dict[str, Any]:
        """Reserve and send the refund once, wait for an unknown outcome, then record it."""
        payload, request_id = event.payload, int(event.payload["request_id"])
        self.report_progress({"stage": "submitting"})
        self.tell(step, event, snapshot, SUBMITTED)
        delay = float(payload.get("retry_delay_seconds") or 2)
        try:
            response = step.do(
                "refund",
                submit_refund,
                request_id,
                key,
                request,
                retries=Retries(limit=5, delay=timedelta(seconds=delay), backoff="exponential"),
                timeout=timedelta(minutes=2),
            )
        except StepError as exc:
            if exc.error_type in (OperationFailed.__name__, RefundRefused.__name__):
                return {"outcome": "failed", "request_id": request_id, "reason": exc.message}
            if exc.error_type not in UNSETTLED:
                raise
            self.report_progress({"stage": "outcome being checked"})
            self.tell(step, event, snapshot, BEING_CHECKED)
            interval = float(payload.get("check_interval_seconds") or CHECK_INTERVAL.total_seconds())
            response = self.await_outcome(step, event, key, request, interval)
            if response is None:
                return {"outcome": "failed", "request_id": request_id, "reason": "the provider rejected it"}

        step.do(
            "record and mark refunded",
            record_refund,
            request_id,
            str(event.run_id),
            snapshot,
            key,
            response,
            atomic=True,
        )
        self.report_progress({"stage": "confirmed"})  # the chat hears it from run(), with every outcome
        return {"outcome": "refunded", "request_id": request_id, "refund": response}

    def refused_by_policy(self, step: Step, name: str, snapshot: dict[str, Any]) -> dict[str, Any] | None:
        """The policy step; the run's outcome if it refuses (a refusal is an outcome, not a failure
        of the run: nothing went wrong, the order no longer allows it)."""
        try:
            step.do(name, check_policy, snapshot)
        except StepError as exc:
            if exc.error_type != RefundRefused.__name__:
                raise
            return {"outcome": "failed", "request_id": snapshot["request_id"], "reason": exc.message}
        return None

    def await_outcome(self, step: Step, event: Event, key: str, request: dict[str, Any], interval: float) -> Any:
        """Check the key until its outcome is known: the response, None if rejected. Between checks
        the run waits at most ``interval``, and is woken as soon as someone else settles the key."""
        for _ in range(MAX_CHECKS):
            if event.version in SLEEPING_VERSIONS:
                step.sleep("wait before checking", interval)
            else:
                wait_for_outcome(step, "wait for the outcome", key=key, timeout=interval)
            check: dict[str, Any] = step.do("check outcome", check_refund, key, request)
            if check["state"] == "succeeded":
                return check["response"]
            if check["state"] == "failed":
                return None
        raise NonRetryableError(
            f"the outcome of refund {key!r} is still unknown after {MAX_CHECKS} checks; "
            "resolve it in the admin (External operations)"
        )


# --- the steps ----------------------------------------------------------------------------------
def load_snapshot(request_id: int, *, lock: bool = False) -> dict[str, Any]:
    """What the run decides on: the order's version, amounts and balance, the request, and when it
    was read (the record's observed_at). Ids and what a decision needs, never personal data (no
    shipping address): it is stored in the step's result and shown to reviewers.

    The request must be this run's own (a refund run is started only by ``refund_request_create``,
    in the transaction that creates its request). ``lock``: hold the order row to the end of the
    caller's transaction.
    """
    request = RefundRequest.objects.select_related("order").get(pk=request_id)
    context = current_step()
    if context is not None and request.run_id != context.run_id:
        raise NonRetryableError(f"refund request {request_id} belongs to another run")
    order = Order.objects.select_for_update().get(pk=request.order_id) if lock else request.order
    balance = order_balance(order=order, exclude_request_id=request.pk)
    return {
        "request_id": request.pk,
        "order_id": order.pk,
        "order": order.number,
        "operation_key": request.operation_key,
        "version": str(order.version),
        "customer_id": request.customer_id,
        "order_amount": str(order.amount),
        "refund_amount": str(request.amount),
        "refundable": str(balance.refundable),
        "already_refunded": str(balance.refunded),
        "currency": order.currency,
        "status": order.status,
        "items": order.items,
        "reason": request.reason,
        "observed_at": timezone.now().isoformat(),
        # Per order, not per request: what the order's other requests refunded or may still refund
        # counts too, so splitting a refund into pieces below the limit does not avoid a reviewer.
        # Decided once and stored: a limit changed later does not change a run in flight.
        "needs_approval": needs_approval(balance=balance, amount=request.amount),
    }


def check_policy(snapshot: dict[str, Any]) -> bool:
    """An early, cheap answer from the snapshot; ``refund_reserve`` decides again under the lock."""
    if Decimal(snapshot["refund_amount"]) > Decimal(snapshot["refundable"]):
        raise RefundRefused(
            f"the refund ({snapshot['refund_amount']}) exceeds what order {snapshot['order']} "
            f"can still refund ({snapshot['refundable']} of {snapshot['order_amount']})"
        )
    return True


def check_proposal(proposal: Proposal) -> None:
    """Before each approval request is raised: the policy, on the order as the reviewer would see it."""
    check_policy(proposal.content)


def order_proposal(request_id: int) -> Proposal:
    """What the approvers review: the current version of the order and the refund in words.

    Called in approve_current's request and re-check steps (atomic). The order stays locked until the
    request is stored: an order_change (which locks the order, then supersedes pending requests)
    then either comes first, and this reads the new version, or waits, and supersedes the request.
    Order row before run row, as order_change takes them.
    """
    snapshot = load_snapshot(request_id, lock=True)
    sign = CURRENCY_SIGNS.get(snapshot["currency"], snapshot["currency"] + " ")
    content = {k: v for k, v in snapshot.items() if k not in ("observed_at", "needs_approval")}
    return Proposal(
        version=snapshot["version"],
        content=content,
        summary=f"Refund {sign}{snapshot['refund_amount']} on order {snapshot['order']}",
    )


def earlier_refund(key: str) -> dict[str, Any] | None:
    """The request's ledger operation, if an earlier attempt of the run reserved it: its status
    and the exact request it stands for (sent again, or looked up, with the same fingerprint)."""
    op = ExternalOperation.objects.filter(key=key).values("status", "request").first()
    return None if op is None else {"status": op["status"], "request": op["request"]}


def refund_body(snapshot: dict[str, Any]) -> dict[str, Any]:
    """What the provider gets: no personal data beyond the order number."""
    return {"order": snapshot["order"], "amount": snapshot["refund_amount"], "currency": snapshot["currency"]}


def approved_body(approval_request_id: int) -> dict[str, Any]:
    """The provider's request as the reviewer approved it (their request's snapshot of the order)."""
    return refund_body(approvals.approved_content(approval_request_id))


def submit_refund(request_id: int, key: str, request: dict[str, Any]) -> Any:
    """Reserve (the balance checked again under the order's lock; the operation recorded), then
    send. OutcomeUnknown and OperationInProgress propagate: the step's retries call perform again,
    which looks the key up before it could send anything a second time."""
    refund_reserve(request_id=request_id, key=key, request=request)
    return perform(key=key, system="payments", action="refund", request=request)


def check_refund(key: str, request: dict[str, Any]) -> dict[str, Any]:
    try:
        response = perform(key=key, system="payments", action="refund", request=request)
    except (OutcomeUnknown, OperationInProgress, ProviderUnavailable) as exc:
        return {"state": "unknown", "reason": str(exc)}
    except OperationFailed as exc:
        return {"state": "failed", "reason": str(exc)}
    return {"state": "succeeded", "response": response}


def record_refund(request_id: int, run_id: str, snapshot: dict[str, Any], key: str, response: Any) -> int | None:
    """The operational record and the order's new status, in the step's one transaction: the
    record's id, or None if the request's refund was recorded before."""
    assert transaction.get_connection().in_atomic_block, "run as an atomic step"
    if refund_recorded(request_id=request_id, order_id=snapshot["order_id"]):
        return None  # a restarted run's: recorded once, by its earlier attempt or reconcile
    observed_at = parse_datetime(snapshot["observed_at"])
    record = record_create(
        request_id=refund_record_id(request_id),
        run=run_id,
        step="refund",
        tool=REFUND_TOOL,
        observed_at=observed_at,
        approval_pending=False,
        operation=ExternalOperation.objects.filter(key=key).first(),
        # The order as it was relied on; its address is redacted by record_create.
        response={"provider": response, "order": snapshot},
    )
    refund_mark_recorded(request_id=request_id, order_id=snapshot["order_id"])  # a change: a new version
    return record.pk
