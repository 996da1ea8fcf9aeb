"""The whole HTTP API fuzzed from its own OpenAPI schema (``/api/schema/``) with schemathesis and
all its checks: no 5xx, every answer in the documented status, content type and shape, every request
the schema calls valid accepted (a 2xx, or 401/403/404/409: who asks, or the state of the object)
and every one it calls invalid refused with a 4xx, the same request without credentials a 401, and
the links between operations followed (stateful).

The API is called in process (Django's WSGI handler) inside the test's transaction on PostgreSQL,
signed in with a token once as alice (a customer) and once as carol (staff who may see and control
every run, decide refunds and review assessments). Nothing is committed, so no worker ever runs the
runs the fuzzer starts.

A few objects exist with ids the schema's generators are told about (``SEEDED``), so about half the
requests that name an object name a real one: alice's run, order, refund request and assessment,
and a refund approval and an assessment review waiting for carol. The rest are random ids (404).

Bounded: ``FUZZ_EXAMPLES`` examples an operation (default 8) and as many stateful scenarios,
derandomised so that a run is repeatable; ``FUZZ_EXAMPLES=200 pytest tests/test_fuzz_api.py``
explores further.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
import schemathesis
from django.conf import settings as django_settings
from django.contrib.auth.models import Group, Permission, User
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections, transaction
from django.utils import timezone
from hypothesis import HealthCheck, settings
from rest_framework.authtoken.models import Token

from approvals.tests.support import GROUP, waiting_request
from examples.refunds.models import RefundRequest
from examples.refunds.services import order_create
from examples.suppliers.models import (
    REVIEWERS,
    SUBJECT_TYPE,
    AssessmentReport,
    AssessmentStatus,
    SourceRecord,
    SupplierAssessment,
)
from ledger.models import ExternalOperation
from tests.factories import Users
from workflows.models import RunAttempt, RunStatus, WorkflowRun

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "8"))

# The seeded objects' ids: far above anything the sequences reach in a test session.
RUN_ID = UUID("5eed0000-0000-4000-8000-000000000001")
REFUND_RUN_ID = UUID("5eed0000-0000-4000-8000-000000000002")
ORDER = "5501"
REFUND_ID = 990_001
APPROVAL_ID = 990_002
REVIEW_ID = 990_003
ASSESSMENT_ID = 990_004
SEEDED = {
    "path.run_id": [str(RUN_ID), str(REFUND_RUN_ID)],
    "path.number": [ORDER],
    "path.refund_id": [REFUND_ID],
    "path.request_id": [APPROVAL_ID, REVIEW_ID],
    "path.assessment_id": [ASSESSMENT_ID],
    # Public workflows that take any payload object (demo.onboarding, which states its payload, is
    # an operation of its own: POST /api/workflows/demo.onboarding/runs).
    "path.name": ["test.echo", "test.wait"],
}
CONFIG = schemathesis.Config.from_dict(
    {
        "dictionaries": {key: {"values": values} for key, values in SEEDED.items()},
        "parameters": {key: {"dictionary": key, "probability": 0.5} for key in SEEDED},
    }
)

# Loaded at collection (no database needed to describe the API): one test per operation.
schema = schemathesis.openapi.from_wsgi("/api/schema/", WSGIHandler(), config=CONFIG)

# The token of whom the running test signs in as (set by the ``caller`` fixture).
SIGNED_IN: dict[str, str] = {}


@schema.auth(refresh_interval=None)
class SignedIn:
    """Every request carries the caller's token, as schemathesis' own auth: its checks then know the
    credentials are real and send each operation once more without them, expecting a 401."""

    def get(self, case: Any, context: Any) -> str:
        return SIGNED_IN.get("token", "")  # none while pytest collects the tests

    def set(self, case: Any, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Token {data}"}


FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


# --- the world the fuzzer finds ---------------------------------------------------------------------
@pytest.fixture
def in_process(db: None) -> Iterator[None]:
    """Requests served by the WSGI handler in this thread, inside the test's transaction. The
    handler closes "old" connections at each request's start and end (our connection, inside a
    transaction, looks broken to it); Django's test client switches that off the same way."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def seeded(in_process: None, users: Users) -> dict[str, Any]:
    alice, carol = users.alice, users.carol
    Group.objects.create(name=GROUP).user_set.add(carol)
    Group.objects.create(name=REVIEWERS).user_set.add(carol)
    carol.user_permissions.add(*Permission.objects.filter(codename="view_externaloperation"))
    queue = django_settings.WORKFLOWS["QUEUE"]

    # alice's run, waiting for a reply
    run = WorkflowRun.objects.create(
        id=RUN_ID,
        workflow="test.wait",
        owner=alice,
        status=RunStatus.WAITING,
        queue=queue,
        wait_event_type="reply",
        wait_step="wait for reply",
        wake_at=timezone.now() + timedelta(hours=1),
    )
    RunAttempt.objects.create(run=run, number=1)
    # her order and a refund request on it, whose run waits for its approval (the approval below)
    order = order_create(number=ORDER, customer=alice, amount="150.00")
    refund_run = WorkflowRun.objects.create(
        id=REFUND_RUN_ID,
        workflow="test.wait",
        owner=alice,
        status=RunStatus.WAITING,
        queue=queue,
        payload={"order": ORDER},
    )
    RunAttempt.objects.create(run=refund_run, number=1)
    refund = RefundRequest.objects.create(
        id=REFUND_ID, order=order, customer=alice, amount="120.00", reason="broken", run=refund_run
    )
    approval = waiting_request(id=APPROVAL_ID, requested_by=alice, subject_id=ORDER)
    # her assessment, report v1 under review by carol's group
    assessment = SupplierAssessment.objects.create(
        id=ASSESSMENT_ID, supplier_name="Acme", requested_by=alice, status=AssessmentStatus.READY_FOR_REVIEW
    )
    SourceRecord.objects.create(
        assessment=assessment, source="credit", revision=1, content={"score": 7}, created_by_id=alice.pk
    )
    AssessmentReport.objects.create(
        assessment=assessment, version=1, body={"credit": {"score": 7}}, source_revisions={"credit": 1}
    )
    review = waiting_request(
        id=REVIEW_ID,
        requested_by=alice,
        approvers=REVIEWERS,
        subject_type=SUBJECT_TYPE,
        subject_id=str(ASSESSMENT_ID),
        version="report-v1",
    )
    # an operation in the ledger for the staff's list
    ExternalOperation.objects.create(
        key=f"refund:{ORDER}:{REFUND_ID}",
        system="payments",
        action="refund",
        request={"order": ORDER, "amount": "120.00"},
    )
    return {"run": run, "refund": refund, "approval": approval, "assessment": assessment, "review": review}


@pytest.fixture(params=["alice", "carol"], ids=["customer", "staff"])
def caller(request: pytest.FixtureRequest, seeded: dict[str, Any], users: Users) -> Iterator[User]:
    user = getattr(users, request.param)
    SIGNED_IN["token"] = Token.objects.create(user=user).key
    yield user
    SIGNED_IN.clear()


@contextmanager
def fresh_world() -> Iterator[None]:
    """Each example (each scenario) starts from the seeded world and leaves it as it was: what one
    changed would otherwise change what the next one finds, and Hypothesis could neither repeat nor
    shrink a failure."""
    savepoint = transaction.savepoint()
    try:
        yield
    finally:
        transaction.savepoint_rollback(savepoint)


# --- the tests ----------------------------------------------------------------------------------------
@schema.parametrize()
@FUZZ_SETTINGS
def test_every_operation_answers_as_its_schema_says(case: Any, caller: User) -> None:
    with fresh_world():
        case.call_and_validate()


def test_the_seeded_objects_are_what_the_operations_reach(caller: User) -> None:
    """The fuzzer's ids name real objects (else it would test only 404s): each seeded id answers 200
    to whoever may see it, and the review is one carol may decide."""
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {SIGNED_IN['token']}")
    staff = caller.username == "carol"
    assert client.get(f"/api/runs/{RUN_ID}").status_code == 200
    assert client.get(f"/api/assessments/{ASSESSMENT_ID}").status_code == 200
    if staff:
        assert client.get(f"/api/approvals/{APPROVAL_ID}").status_code == 200
        review = client.get(f"/api/assessments/{ASSESSMENT_ID}").json()["review"]
        assert review == review | {"request": REVIEW_ID, "report_version": 1, "can_decide": True}
    else:
        assert client.get(f"/api/refunds/{REFUND_ID}").json()["order"] == ORDER


def test_linked_operations_hold_together(caller: User) -> None:
    """Stateful: sequences of calls that follow the schema's links (start a run, then pause it; a
    list's first item, then its detail...), every response checked as above, and the stateful checks
    (a created object can be read back, a deleted one is gone)."""

    class Scenario(schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            self.world = fresh_world()
            self.world.__enter__()

        def teardown(self) -> None:
            self.world.__exit__(None, None, None)

    Scenario.run(settings=settings(FUZZ_SETTINGS, stateful_step_count=8))
