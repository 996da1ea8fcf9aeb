"""What the support agent may tell about supplier assessments: those the customer may see."""

from __future__ import annotations

from typing import Any

from agents import ToolContext, tool
from examples.suppliers.selectors import assessment_list


@tool
def assessment_status(ctx: ToolContext, supplier: str) -> dict[str, Any]:
    """Where the assessments of a supplier stand (those the customer asked for).

    Args:
        supplier: The supplier's name, or part of it.
    """
    if ctx.user is None:
        return {"error": ctx.NO_ONE_ASKED}
    found = assessment_list(user=ctx.user, supplier=supplier.strip()[:100])
    return {
        "assessments": [{"id": a.pk, "supplier": a.supplier_name, "status": a.get_status_display()} for a in found[:5]]
    }
