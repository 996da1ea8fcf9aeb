"""What the support agent may do about refunds, as tools: each acts as the customer who wrote the
message, on their own orders only, exactly as the refunds API does."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError

from agents import ToolContext, tool
from examples.refunds.models import RefundRequest
from examples.refunds.selectors import (
    AWAITING_APPROVAL,
    BEING_PREPARED,
    needs_approval,
    order_balance,
    order_get,
    refund_request_get,
    refund_requests_for,
)
from examples.refunds.selectors import refund_status as in_words
from examples.refunds.services import TooManyOpenRequests, refund_request_create
from workflows.exceptions import IdempotencyConflict


@tool
def find_order(ctx: ToolContext, number: str) -> dict[str, Any]:
    """Look up one of the customer's orders by its number.

    Args:
        number: The order number, e.g. 1042.
    """
    if ctx.user is None:
        return {"error": ctx.NO_ONE_ASKED}
    order = order_get(user=ctx.user, number=number)
    if order is None:
        return {"error": f"You have no order {number}."}
    return {
        "number": order.number,
        "amount": str(order.amount),
        "currency": order.currency,
        "refundable": str(order_balance(order=order).refundable),
        "status": order.status,
    }


@tool
def request_refund(ctx: ToolContext, order: str, amount: str, reason: str) -> dict[str, Any]:
    """Ask for a refund on one of the customer's orders. Large refunds wait for a person's approval.

    Args:
        order: The order number.
        amount: The amount to refund, e.g. 20.00.
        reason: Why, in the customer's words.
    """
    if ctx.user is None:
        return {"error": ctx.NO_ONE_ASKED}
    found = order_get(user=ctx.user, number=order)
    if found is None:
        return {"error": f"You have no order {order}."}
    try:
        request, _ = refund_request_create(
            order=found,
            customer=ctx.user,
            amount=amount,
            reason=reason[:500],
            # One request per tool call, however often the call's step runs.
            idempotency_key=idempotency_key(ctx),
            agent=ctx.agent,  # its run tells this chat each change of the request's state
        )
    except (ValidationError, IdempotencyConflict, TooManyOpenRequests) as exc:
        return {"error": "; ".join(getattr(exc, "messages", [str(exc)]))}
    return {"request_id": request.pk, "amount": str(request.amount), "status": status_now(request)}


def idempotency_key(ctx: ToolContext) -> str:
    """The refund request's key for this tool call: the same request whatever retries the call."""
    return f"agent:{ctx.agent.pk}:turn:{ctx.turn_id}:call:{ctx.call_id}"[:200]


def status_now(request: RefundRequest) -> str:
    """What to tell the customer right after asking: the request's state in words, except that a
    request whose run has not decided yet is "awaiting approval" when it will wait for one (its run
    decides the same way from the same order, once it loads it)."""
    status = in_words(request)
    if status == BEING_PREPARED and needs_approval(
        balance=order_balance(order=request.order, exclude_request_id=request.pk), amount=request.amount
    ):
        return AWAITING_APPROVAL
    return status


@tool
def refund_status(ctx: ToolContext, request_id: int | None = None) -> dict[str, Any]:
    """Where the customer's refund requests are, in words (one request, or the latest five).

    Args:
        request_id: One request's id; leave out for the latest ones.
    """
    if ctx.user is None:
        return {"error": ctx.NO_ONE_ASKED}
    if request_id is not None:
        one = refund_request_get(user=ctx.user, request_id=request_id)
        requests = [one] if one is not None else []
    else:
        requests = list(refund_requests_for(user=ctx.user)[:5])
    return {
        "requests": [
            {
                "request_id": r.pk,
                "order": r.order.number,
                "amount": str(r.amount),
                "currency": r.order.currency,
                "status": in_words(r),
            }
            for r in requests
        ]
    }
