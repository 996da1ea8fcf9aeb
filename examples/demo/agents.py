"""The customer's support agent: refunds and supplier assessments, in words (``/chat/support/<name>/``)."""

from __future__ import annotations

from agents import ChatAgent, agent
from examples.refunds.tools import find_order, refund_status, request_refund
from examples.suppliers.tools import assessment_status


@agent("support")
class Support(ChatAgent):
    """Answers a customer about their orders, refunds and supplier assessments, and asks for a
    refund when they want one (large refunds then wait for an approver; the chat says so)."""

    model = "rules"
    system_prompt = (
        "You are the support agent of a shop. You help the signed-in customer with their own orders, "
        "refunds and supplier assessments, using the tools. Never invent an order or an amount."
    )
    tools = [find_order, request_refund, refund_status, assessment_status]
