"""Reads for the home page: the signed-in person's own refund requests, supplier assessments and
runs, each in words, newest first and bounded (a customer with thousands of runs still gets a
page in a few queries per row shown). The refunds and assessments are the examples' (optional,
``settings.INSTALL_EXAMPLES``): each is read only where its app is installed, and imported only
then, since an app's models cannot be imported without it."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import TypedDict
from uuid import UUID

from django.apps import apps
from django.contrib.auth.models import AbstractUser, AnonymousUser

from workflows.selectors import run_list

# Rows shown per list; the page says how many there are in all.
HOME_LIMIT = 20
CURRENCY_SYMBOLS = {"GBP": "£", "EUR": "€", "USD": "$"}


class RefundRow(TypedDict):
    id: int
    order: str
    amount: str
    status: str
    run_id: UUID | None
    created_at: datetime


class AssessmentRow(TypedDict):
    id: int
    supplier_name: str
    status: str
    run_id: UUID | None
    created_at: datetime


class RunRow(TypedDict):
    id: UUID
    workflow: str
    status: str
    created_at: datetime


class HomePage(TypedDict):
    limit: int
    refunds: list[RefundRow] | None  # None: the refund example is not installed
    refund_count: int
    assessments: list[AssessmentRow] | None  # None: the supplier example is not installed
    assessment_count: int
    runs: list[RunRow]
    run_count: int


def money(amount: Decimal, currency: str) -> str:
    symbol = CURRENCY_SYMBOLS.get(currency)
    return f"{symbol}{amount}" if symbol else f"{amount} {currency}"


def home_page(*, user: AbstractUser | AnonymousUser, limit: int = HOME_LIMIT) -> HomePage:
    """What ``/`` shows ``user``: only what is theirs, even for staff who may see everyone's runs
    or reviewers who see every assessment (the admin is where they see those)."""
    refunds, refund_count = refund_rows(user=user, limit=limit)
    assessments, assessment_count = assessment_rows(user=user, limit=limit)
    # run_list decides what the user may see at all; the home page narrows it to their own.
    runs = (
        run_list(user=user).filter(owner_id=user.pk).order_by("-created_at", "-id")
        if user.is_authenticated
        else run_list(user=user).none()
    )
    return {
        "limit": limit,
        "refunds": refunds,
        "refund_count": refund_count,
        "assessments": assessments,
        "assessment_count": assessment_count,
        "runs": [
            {"id": run.id, "workflow": run.workflow, "status": run.status, "created_at": run.created_at}
            for run in runs.only("id", "workflow", "status", "created_at")[:limit]
        ],
        "run_count": runs.count(),
    }


def refund_rows(*, user: AbstractUser | AnonymousUser, limit: int) -> tuple[list[RefundRow] | None, int]:
    """The newest ``limit`` of the user's refund requests and how many there are; None without
    the refund example."""
    if not apps.is_installed("examples.refunds"):
        return None, 0
    from examples.refunds.selectors import refund_requests_for, refund_status

    refunds = refund_requests_for(user=user)
    rows: list[RefundRow] = [
        {
            "id": r.pk,
            "order": r.order.number,
            "amount": money(r.amount, r.order.currency),
            "status": refund_status(r),
            "run_id": r.run_id,
            "created_at": r.created_at,
        }
        for r in refunds[:limit]
    ]
    return rows, refunds.count()


def assessment_rows(*, user: AbstractUser | AnonymousUser, limit: int) -> tuple[list[AssessmentRow] | None, int]:
    """The newest ``limit`` of the assessments the user asked for and how many there are; None
    without the supplier example."""
    if not apps.is_installed("examples.suppliers"):
        return None, 0
    from examples.suppliers.selectors import assessment_status_words, assessments_requested_by

    assessments = assessments_requested_by(user=user)
    rows: list[AssessmentRow] = [
        {
            "id": a.pk,
            "supplier_name": a.supplier_name,
            "status": assessment_status_words(a),
            "run_id": a.run_id,
            "created_at": a.created_at,
        }
        for a in assessments[:limit]
    ]
    return rows, assessments.count()
