"""The ledger's reads, called directly: which operations a person may resolve by hand, and which
need attention first. Operations and runs are set up in the database directly, in any state."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ledger.models import ExternalOperation, OperationStatus
from ledger.selectors import attention_label, in_doubt, operation_list, operations_to_reconcile, resolvable_by_hand
from ledger.tests.support import make_operation
from workflows.models import RunStatus, WorkflowRun

# ledger_settings: a submit is stale 5 s after it was sent.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("ledger_settings")]


def run_in(status: str) -> WorkflowRun:
    # The engine's status is protected: set once, at creation.
    return WorkflowRun.objects.create(workflow="ledger.test.refund", queue="none", status=status)


def every_kind() -> dict[str, ExternalOperation]:
    """One operation of each kind the rules tell apart, by what it is."""
    ended, running = run_in(RunStatus.TERMINATED), run_in(RunStatus.RUNNING)
    return {
        "unknown": make_operation("unknown"),
        "stale submit": make_operation("stale", OperationStatus.SUBMITTED, sent_ago=timedelta(hours=1)),
        "submit never timed": make_operation("untimed", OperationStatus.SUBMITTED, sent_ago=None),
        "sent, run ended": make_operation("orphan", OperationStatus.PENDING, submit_count=1, run=ended),
        "fresh submit": make_operation("fresh", OperationStatus.SUBMITTED, sent_ago=timedelta(seconds=1)),
        "never sent, run ended": make_operation("unsent", OperationStatus.PENDING, run=ended),
        "sent, run going on": make_operation("resend", OperationStatus.PENDING, submit_count=1, run=running),
        "sent, no run": make_operation("no-run", OperationStatus.PENDING, submit_count=1),
        "succeeded": make_operation("done", OperationStatus.SUCCEEDED),
        "failed": make_operation("gone", OperationStatus.FAILED),
    }


IN_DOUBT = {"unknown", "stale submit", "submit never timed", "sent, run ended"}


def test_resolvable_by_hand_is_unknown_a_stale_submit_or_sent_and_orphaned() -> None:
    # given
    ops = every_kind()

    # then
    assert {what for what, op in ops.items() if resolvable_by_hand(op)} == IN_DOUBT


def test_reconcile_selects_in_sql_what_is_in_doubt_and_what_it_abandons() -> None:
    # given
    ops = every_kind()

    # when reconcile selects its operations with one query
    selected = set(operations_to_reconcile())

    # then they are the ones in_doubt says in Python, and the never-sent ones of ended runs
    assert {what for what, op in ops.items() if op in selected} == IN_DOUBT | {"never sent, run ended"}
    assert {what for what, op in ops.items() if in_doubt(op)} == IN_DOUBT


def test_operation_list_ranks_what_needs_attention_and_filters() -> None:
    # given
    make_operation("unknown")
    make_operation("stale", OperationStatus.SUBMITTED, sent_ago=timedelta(hours=1))
    make_operation("ended", OperationStatus.PENDING, run=run_in(RunStatus.FAILED))
    make_operation("failed", OperationStatus.FAILED, system="mail")
    make_operation("fine", OperationStatus.SUCCEEDED)

    # when
    ranked = {
        op.key: attention_label(op.attention_rank)  # type: ignore[attr-defined]  # an annotation
        for op in operation_list()
    }

    # then
    assert ranked == {
        "unknown": "unknown",
        "stale": "stale submit",
        "ended": "run ended, not final",
        "failed": "failed",
        "fine": None,
    }
    assert [op.key for op in operation_list(status=OperationStatus.FAILED)] == ["failed"]
    assert [op.key for op in operation_list(system="mail")] == ["failed"]
