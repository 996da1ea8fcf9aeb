"""``perform`` against PostgreSQL and a real HTTP provider (a server thread on 127.0.0.1).

These tests run outside a test transaction (``transaction=True``): perform refuses to run inside
one, because it must commit "submitted" before it calls out.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from functools import partial
from typing import Any
from unittest.mock import ANY

import pytest
import redis
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ledger import (
    HttpAdapter,
    IdempotencyConflict,
    OperationFailed,
    OutcomeUnknown,
    perform,
    register_adapter,
    unregister_adapter,
)
from ledger.adapters import Failed, NoEffect, Succeeded
from ledger.exceptions import (
    InvalidOperation,
    OperationInProgress,
    PerformInTransaction,
    ProviderUnavailable,
    UnknownSystem,
)
from ledger.models import EventKind, ExternalOperation, OperationEvent, OperationStatus
from ledger.services import operation_report
from ledger.tests.provider import FakeProvider, Fault
from ledger.tests.support import make_operation, snapshot
from tests.support import free_port, race, wait_for
from workflows import IdempotencyConflict as WorkflowsIdempotencyConflict
from workflows import NonRetryableError

pytestmark = pytest.mark.django_db(transaction=True)

REQUEST = {"order": 1042, "amount": "120.00"}
HANG = Fault("accept_then_hang", seconds=1.5)  # three times the client's 0.5 s read timeout


def refund(key: str, request: dict[str, Any] | None = None, action: str = "refund") -> Any:
    return perform(key=key, system="payments", action=action, request=REQUEST if request is None else request)


def operation(key: str) -> ExternalOperation:
    return ExternalOperation.objects.get(key=key)


def events(key: str) -> list[tuple[str, str, str, str]]:
    return list(
        OperationEvent.objects.filter(operation__key=key)
        .order_by("id")
        .values_list("kind", "outcome", "status_before", "status_after")
    )


# --- success and answers from storage -----------------------------------------------------------
def test_success_is_stored_and_the_same_key_answers_from_storage_without_a_call(payments: FakeProvider) -> None:
    # when
    first = refund("refund:1042:r1")
    second = refund("refund:1042:r1")

    # then the provider saw one request, carrying the key as its idempotency key
    assert first == second == payments.records["refund:1042:r1"]
    assert first["status"] == "succeeded" and first["amount"] == "120.00"
    assert payments.submits() == 1 and payments.lookups() == 0
    assert payments.calls[0].idempotency_key == "refund:1042:r1"
    assert payments.calls[0].body == REQUEST
    op = operation("refund:1042:r1")
    assert (op.status, op.submit_count, op.response) == (OperationStatus.SUCCEEDED, 1, first)
    assert op.finished_at is not None
    assert events("refund:1042:r1") == [("submit", "succeeded", "submitted", "succeeded")]


def test_a_reused_key_with_another_request_is_a_conflict_and_changes_nothing(payments: FakeProvider) -> None:
    # given
    refund("refund:1042:r1")
    before = snapshot(operation("refund:1042:r1"))

    # when / then: another amount, another action, another system: all refused
    with pytest.raises(IdempotencyConflict) as conflict:
        refund("refund:1042:r1", {"order": 1042, "amount": "999.00"})
    with pytest.raises(IdempotencyConflict):
        refund("refund:1042:r1", action="charge")
    register_adapter("other", HttpAdapter(base_url=payments.url))
    try:
        with pytest.raises(IdempotencyConflict):
            perform(key="refund:1042:r1", system="other", action="refund", request=REQUEST)
    finally:
        unregister_adapter("other")

    # then nothing changed and nothing was sent
    assert snapshot(operation("refund:1042:r1")) == before
    assert payments.submits() == 1 and payments.lookups() == 0
    assert ExternalOperation.objects.count() == 1
    # one except clause catches both apps' conflicts, and a workflow step does not retry it
    assert isinstance(conflict.value, WorkflowsIdempotencyConflict)
    assert isinstance(conflict.value, NonRetryableError)


def test_the_same_request_in_another_key_order_is_the_same_request(payments: FakeProvider) -> None:
    refund("k-order", {"order": 1, "amount": "5.00", "meta": {"a": 1, "b": 2}})
    assert refund("k-order", {"meta": {"b": 2, "a": 1}, "amount": "5.00", "order": 1})["status"] == "succeeded"
    assert payments.submits() == 1


# --- unknown outcomes and reconciliation before a new submit ------------------------------------
def test_accept_then_timeout_is_unknown_and_the_next_perform_reconciles_without_submitting_again(
    payments: FakeProvider,
) -> None:
    # given the provider applies the refund, then never answers
    payments.inject("submit", "refund:7", HANG)

    # when
    with pytest.raises(OutcomeUnknown) as unknown:
        refund("refund:7")

    # then the ledger does not know, and says so; the provider did it exactly once
    op = operation("refund:7")
    assert op.status == OperationStatus.UNKNOWN
    assert "ReadTimeout" in op.note and "ReadTimeout" in unknown.value.reason
    assert payments.applied == ["refund:7"]

    # when the workflow retries
    result = refund("refund:7")

    # then it asked the provider instead of sending again, and has the provider's answer
    assert result == payments.records["refund:7"]
    assert payments.submits("refund:7") == 1 and payments.lookups("refund:7") == 1
    assert payments.applied == ["refund:7"]
    op = operation("refund:7")
    assert (op.status, op.submit_count, op.lookup_count) == (OperationStatus.SUCCEEDED, 1, 1)
    assert events("refund:7") == [
        ("submit", "unknown", "submitted", "unknown"),
        ("lookup", "succeeded", "unknown", "succeeded"),
    ]
    # and from now on answers from storage
    assert refund("refund:7") == result
    assert payments.lookups("refund:7") == 1


def sent_long_ago(key: str) -> None:
    """Move the last send of ``key`` back past the in-flight window: it can no longer be on its way."""
    ExternalOperation.objects.filter(key=key).update(submitted_at=timezone.now() - timedelta(minutes=5))


def test_lost_response_then_lookup_not_found_submits_again_safely(payments: FakeProvider) -> None:
    # given the connection drops before the provider did anything
    payments.inject("submit", "refund:8", Fault("drop"))
    with pytest.raises(OutcomeUnknown):
        refund("refund:8")
    assert operation("refund:8").status == OperationStatus.UNKNOWN
    assert payments.applied == []

    # when the lookup says "not found" while the request may still be on its way
    with pytest.raises(OutcomeUnknown) as early:
        refund("refund:8")

    # then that proves nothing: still unknown, nothing sent again
    assert "may still reach the provider" in str(early.value)
    assert operation("refund:8").status == OperationStatus.UNKNOWN
    assert payments.lookups("refund:8") == 1 and payments.submits("refund:8") == 1

    # when the send is older than the in-flight window and the provider still has no record of it
    sent_long_ago("refund:8")
    result = refund("refund:8")

    # then "never received" is believed, so it was sent again, once
    assert result["status"] == "succeeded"
    assert payments.lookups("refund:8") == 2 and payments.submits("refund:8") == 2
    assert payments.applied == ["refund:8"]
    op = operation("refund:8")
    assert (op.status, op.submit_count) == (OperationStatus.SUCCEEDED, 2)
    assert events("refund:8") == [
        ("submit", "unknown", "submitted", "unknown"),
        ("lookup", "not_found", "unknown", "unknown"),
        ("lookup", "not_found", "unknown", "pending"),
        ("submit", "succeeded", "submitted", "succeeded"),
    ]


def test_a_not_found_while_the_provider_still_processes_is_not_believed(payments: FakeProvider) -> None:
    """The provider answers lookups "not found" while it is still working on the original request:
    the ledger must not send it again, and must learn the outcome once the provider has it."""
    # given the provider holds the submit (reading it) past our read timeout, then acts on it
    payments.inject("submit", "refund:80", Fault("delay", seconds=1.5))
    with pytest.raises(OutcomeUnknown):
        refund("refund:80")

    # when the next perform looks it up before the provider has recorded it
    with pytest.raises(OutcomeUnknown):
        refund("refund:80")
    assert payments.submits("refund:80") == 1 and operation("refund:80").status == OperationStatus.UNKNOWN

    # then once the provider has it, the lookup finds it: one refund, never two
    wait_for(lambda: "refund:80" in payments.applied, timeout=10, what="the provider to act")
    assert refund("refund:80")["status"] == "succeeded"
    assert payments.applied == ["refund:80"] and payments.submits("refund:80") == 1


def test_a_5xx_is_unknown_and_the_next_perform_finds_out_by_lookup(payments: FakeProvider) -> None:
    # A 500 can come after the provider committed the effect: never taken as "did not happen".
    payments.inject("submit", "refund:9", Fault("error", status=503))
    with pytest.raises(OutcomeUnknown) as unknown:
        refund("refund:9")
    assert "HTTP 503" in str(unknown.value)
    assert operation("refund:9").status == OperationStatus.UNKNOWN

    # (a 502/504 from a gateway says the service behind it may still be working on it: a "not
    # found" is believed only once the send is older than the in-flight window)
    sent_long_ago("refund:9")
    assert refund("refund:9")["status"] == "succeeded"
    assert payments.lookups("refund:9") == 1 and payments.submits("refund:9") == 2
    assert payments.applied == ["refund:9"]


def test_a_failed_lookup_leaves_the_operation_unknown_and_sends_nothing(payments: FakeProvider) -> None:
    # given an unknown operation whose provider then fails the lookup
    payments.inject("submit", "refund:10", HANG)
    with pytest.raises(OutcomeUnknown):
        refund("refund:10")
    payments.inject("lookup", "refund:10", Fault("error", status=500), Fault("drop"))

    # when / then: twice unknown, nothing sent again
    for _ in range(2):
        with pytest.raises(OutcomeUnknown):
            refund("refund:10")
        assert operation("refund:10").status == OperationStatus.UNKNOWN
    assert payments.submits("refund:10") == 1 and payments.lookups("refund:10") == 2

    # and once the lookup works, it resolves
    assert refund("refund:10")["status"] == "succeeded"
    assert payments.submits("refund:10") == 1 and payments.applied == ["refund:10"]


def test_a_system_that_cannot_look_up_leaves_unknown_for_a_person(provider: FakeProvider, ledger_settings: Any) -> None:
    register_adapter("blind", HttpAdapter(base_url=provider.url, lookup_path=None))
    try:
        provider.inject("submit", "blind:1", HANG)
        with pytest.raises(OutcomeUnknown):
            perform(key="blind:1", system="blind", action="refund", request=REQUEST)

        with pytest.raises(OutcomeUnknown) as again:
            perform(key="blind:1", system="blind", action="refund", request=REQUEST)
    finally:
        unregister_adapter("blind")

    assert "a person must resolve it" in str(again.value)
    assert operation("blind:1").status == OperationStatus.UNKNOWN
    assert provider.submits() == 1 and provider.lookups() == 0


def test_a_stale_submit_is_looked_up_and_a_fresh_one_is_left_to_its_worker(payments: FakeProvider) -> None:
    # given a submit whose worker died an hour ago, after the provider applied it
    make_operation("stale:1", OperationStatus.SUBMITTED, request=REQUEST, sent_ago=timedelta(hours=1))
    payments.seed("stale:1")
    # and one sent a moment ago, still in flight
    fresh = make_operation("fresh:1", OperationStatus.SUBMITTED, request=REQUEST, sent_ago=timedelta(seconds=1))
    before = snapshot(fresh)

    # when / then
    assert refund("stale:1") == payments.records["stale:1"]
    with pytest.raises(OperationInProgress) as in_progress:
        refund("fresh:1")

    assert operation("stale:1").status == OperationStatus.SUCCEEDED
    assert payments.submits() == 0 and payments.lookups() == 1
    assert snapshot(fresh) == before
    assert isinstance(in_progress.value, OutcomeUnknown)  # retryable: the next try sees the outcome


# --- definitive answers -------------------------------------------------------------------------
def test_a_rejection_fails_the_operation_for_good(payments: FakeProvider) -> None:
    payments.inject("submit", "refund:11", Fault("reject", reason="card_declined"))

    with pytest.raises(OperationFailed) as failed:
        refund("refund:11")
    with pytest.raises(OperationFailed) as again:
        refund("refund:11")

    assert failed.value.reason == again.value.reason == "card_declined"
    assert "new key" in str(failed.value)
    assert isinstance(failed.value, NonRetryableError)  # a workflow step fails at once, no silent retry
    op = operation("refund:11")
    assert op.status == OperationStatus.FAILED and op.error == {"reason": "card_declined", "detail": ANY}
    assert payments.submits() == 1 and payments.lookups() == 0


def test_a_connect_error_sent_nothing_so_the_retry_submits_without_a_lookup(payments: FakeProvider) -> None:
    # given nothing listens where the adapter points
    register_adapter("payments", HttpAdapter(base_url=f"http://127.0.0.1:{free_port()}"))

    # when
    with pytest.raises(ProviderUnavailable) as unavailable:
        refund("refund:12")

    # then it is pending again: known not to have happened
    assert "could not connect" in unavailable.value.reason
    op = operation("refund:12")
    assert (op.status, op.submit_count) == (OperationStatus.PENDING, 1)
    assert events("refund:12") == [("submit", "no_effect", "submitted", "pending")]

    # when the provider is back
    register_adapter("payments", HttpAdapter(base_url=payments.url))
    assert refund("refund:12")["status"] == "succeeded"

    # then no lookup was needed
    assert payments.lookups() == 0 and payments.submits() == 1
    assert operation("refund:12").submit_count == 2


def test_a_rate_limit_is_no_effect_and_safe_to_retry(payments: FakeProvider) -> None:
    payments.inject("submit", "refund:13", Fault("rate_limit"))
    with pytest.raises(ProviderUnavailable):
        refund("refund:13")
    assert operation("refund:13").status == OperationStatus.PENDING
    assert refund("refund:13")["status"] == "succeeded"
    assert payments.submits() == 2 and payments.lookups() == 0 and payments.applied == ["refund:13"]


def test_an_interrupted_call_is_recorded_as_unknown(payments: FakeProvider) -> None:
    """A step timeout (SIGALRM) or a crash inside the adapter, after the request went out."""

    class Interrupted(HttpAdapter):
        def submit(self, op: ExternalOperation) -> Any:
            super().submit(op)
            raise TimeoutError("step timed out")

    register_adapter("payments", Interrupted(base_url=payments.url))
    with pytest.raises(TimeoutError):
        refund("refund:14")
    assert operation("refund:14").status == OperationStatus.UNKNOWN
    assert "interrupted" in operation("refund:14").note

    register_adapter("payments", HttpAdapter(base_url=payments.url))
    assert refund("refund:14")["status"] == "succeeded"
    assert payments.submits() == 1 and payments.applied == ["refund:14"]


def test_a_success_answered_after_a_failure_was_recorded_meanwhile_corrects_it(payments: FakeProvider) -> None:
    """The submit was in flight when a report (a webhook, a lookup) recorded it failed; then the
    provider's own answer says it succeeded: the money moved, so the failure is corrected, flagged."""

    class FailedMeanwhile(HttpAdapter):
        def submit(self, op: ExternalOperation) -> Any:
            answer = super().submit(op)
            with transaction.atomic():
                operation_report(key=op.key, system="payments", outcome=Failed("declined"), reported_by="a test")
            assert operation(op.key).status == OperationStatus.FAILED
            return answer

    register_adapter("payments", FailedMeanwhile(base_url=payments.url))

    assert refund("refund:15") == payments.records["refund:15"]  # the caller gets the success

    op = operation("refund:15")
    assert op.status == OperationStatus.SUCCEEDED and "corrected" in op.note
    assert events("refund:15")[-1][:2] == ("submit", "succeeded")


@pytest.mark.parametrize(
    ("reported", "level"),
    [(Succeeded({"id": "from the webhook"}), "INFO"), (NoEffect("not acted on"), "ERROR")],
    ids=["the same", "a contradiction"],
)
def test_a_submit_answered_after_its_webhook_settled_it_is_kept_beside_it(
    payments: FakeProvider, caplog: pytest.LogCaptureFixture, reported: Any, level: str
) -> None:
    """The provider's webhook often arrives before its answer to the submit: an answer that says the
    same is the ordinary race (INFO), one that contradicts what was recorded is for a person (ERROR)."""

    class SettledMeanwhile(HttpAdapter):
        def submit(self, op: ExternalOperation) -> Any:
            answer = super().submit(op)
            with transaction.atomic():
                operation_report(key=op.key, system="payments", outcome=Succeeded({}), reported_by="a test")
            return reported if isinstance(reported, NoEffect) else answer

    register_adapter("payments", SettledMeanwhile(base_url=payments.url))
    caplog.set_level(logging.INFO, logger="ledger")

    refund("refund:16")

    op = operation("refund:16")
    assert op.status == OperationStatus.SUCCEEDED  # the webhook's record stands
    said = "succeeded" if level == "INFO" else "no_effect"
    assert events("refund:16")[-1][:2] == ("submit", said)
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if "refund:16" in r.getMessage()]
    late = f"the submit's answer ({said}) arrived after the operation was already succeeded"
    assert [level for level, message in logged if late in message] == ["INFO", "ERROR"][: 1 + (level == "ERROR")]
    assert not [message for level, message in logged if level in ("WARNING", "ERROR") and late not in message]


# --- concurrency --------------------------------------------------------------------------------
def test_two_workers_performing_one_key_at_once_submit_once(payments: FakeProvider) -> None:
    for i in range(3):
        key = f"race:{i}"
        # the provider is slow, so the second worker arrives while the first is calling
        payments.inject("submit", key, Fault("delay", seconds=0.3))

        outcomes = race(partial(refund, key))

        assert payments.submits(key) == 1, outcomes
        answers = [o for o in outcomes if isinstance(o, dict)]
        assert answers and all(a == payments.records[key] for a in answers), outcomes
        assert all(isinstance(o, dict | OperationInProgress) for o in outcomes), outcomes
        assert refund(key) == payments.records[key]  # and afterwards, from storage
        assert payments.submits(key) == 1
    assert ExternalOperation.objects.count() == 3


def test_two_workers_reconciling_one_unknown_key_send_it_again_once(payments: FakeProvider) -> None:
    for i in range(3):
        key = f"race-unknown:{i}"
        make_operation(key, OperationStatus.UNKNOWN, request=REQUEST)  # the provider never got it
        payments.inject("lookup", key, Fault("delay", seconds=0.1), Fault("delay", seconds=0.1))
        payments.inject("submit", key, Fault("delay", seconds=0.3))

        outcomes = race(partial(refund, key))

        assert payments.submits(key) == 1, outcomes
        assert payments.applied.count(key) == 1
        assert all(isinstance(o, dict | OperationInProgress) for o in outcomes), outcomes
        assert operation(key).status == OperationStatus.SUCCEEDED


# --- refusals before anything is stored ---------------------------------------------------------
def test_perform_refuses_to_run_inside_a_transaction(payments: FakeProvider) -> None:
    with pytest.raises(PerformInTransaction), transaction.atomic():
        refund("refund:15")
    assert not ExternalOperation.objects.exists()
    assert payments.calls == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"key": ""},
        {"key": "x" * 256},
        {"action": ""},
        {"request": ["not", "an", "object"]},
        {"request": {"amount": float("nan")}},
        {"request": {"when": object()}},
    ],
)
def test_bad_input_is_refused_and_stores_nothing(payments: FakeProvider, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidOperation):
        perform(**{"key": "k", "system": "payments", "action": "refund", "request": REQUEST, **kwargs})
    assert not ExternalOperation.objects.exists()
    assert payments.calls == []


def test_an_unknown_system_is_refused_and_stores_nothing(payments: FakeProvider) -> None:
    with pytest.raises(UnknownSystem, match="no adapter is registered for system 'nowhere'"):
        perform(key="k", system="nowhere", action="refund", request=REQUEST)
    assert not ExternalOperation.objects.exists()


# --- personal data stays out of the logs ---------------------------------------------------------
def test_logs_and_events_hold_redacted_payloads_only(payments: FakeProvider, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    personal = {
        "order": 1,
        "amount": "3.00",
        "customer": {
            "Email": "alice@example.com",
            "contacts": [{"phone": "+44 7700 900123"}],
            "billing_address": {"street": "1 High Street"},
        },
    }
    payments.inject("submit", "pd:2", Fault("reject"))

    refund("pd:1", personal)  # the provider echoes the customer back
    with pytest.raises(OperationFailed):
        refund("pd:2", personal)

    logged = caplog.text
    assert "pd:1" in logged and "pd:2" in logged  # the ledger did log them
    for secret in ("alice@example.com", "7700 900123", "High Street"):
        assert secret not in logged
        assert all(secret not in str(detail) for detail in OperationEvent.objects.values_list("detail", flat=True))
    assert '"order"' not in logged and "3.00" not in logged  # no payload at all, redacted or not
    # the operation itself keeps what it needs to answer from storage and to send again
    assert operation("pd:1").response == payments.records["pd:1"]
    assert payments.records["pd:1"]["customer"]["Email"] == "alice@example.com"
    assert EventKind.SUBMIT in {e[0] for e in events("pd:1")}


# --- end to end: a workflow step in a real Celery worker ----------------------------------------
def test_a_workflow_step_that_timed_out_reconciles_on_its_retry_and_refunds_once(provider: FakeProvider) -> None:
    import ledger.tests.workflows_fixtures  # noqa: F401  registers the workflow in this process
    from tests.support import Worker, wait_for_terminal
    from workflows import public as wf

    # given a worker of its own (its own queue: the session's worker does not know this workflow)
    queue = f"ledger-e2e-{os.getpid()}"
    worker = Worker(
        concurrency=1,
        queue=queue,
        WORKFLOWS_MODULES="ledger.tests.workflows_fixtures",
        LEDGER_CONNECT_TIMEOUT="0.5",
        LEDGER_READ_TIMEOUT="0.5",
        LEDGER_STALE_SUBMITTED_SECONDS="5",
    )
    try:
        # and a provider that applies the first submit and never answers it
        provider.inject("submit", "refund:e2e", HANG)

        # when
        run = wf.start(
            "ledger.test.refund", {"provider_url": provider.url, "key": "refund:e2e", "request": REQUEST}, queue=queue
        )
        run = wait_for_terminal(run.id, timeout=60)
    finally:
        worker.stop()
        redis.Redis.from_url(settings.REDIS_URL).delete(
            queue, f"{queue}-io", f"_kombu.binding.{queue}", f"_kombu.binding.{queue}-io"
        )

    # then the run completed with the provider's answer, and the refund happened once
    assert run.status == "completed", (run.error, worker.output()[-3000:])
    assert run.result == provider.records["refund:e2e"]
    assert provider.applied == ["refund:e2e"]
    assert provider.submits() == 1 and provider.lookups() == 1
    assert [s.tries for s in run.steps.all()] == [2]  # the first try ended in OutcomeUnknown
    assert events("refund:e2e") == [
        ("submit", "unknown", "submitted", "unknown"),
        ("lookup", "succeeded", "unknown", "succeeded"),
    ]


def test_prepare_records_the_intent_in_the_callers_transaction_and_perform_sends_it(payments: FakeProvider) -> None:
    from ledger import prepare

    request = {"order": "P1", "amount": "10.00"}
    with transaction.atomic():
        op = prepare(key="refund:p1", system="payments", action="refund", request=request)
        assert prepare(key="refund:p1", system="payments", action="refund", request=request).pk == op.pk
    assert (op.status, op.submit_count) == (OperationStatus.PENDING, 0)
    assert payments.submits() == 0

    with pytest.raises(IdempotencyConflict):
        prepare(key="refund:p1", system="payments", action="refund", request={**request, "amount": "11.00"})

    assert refund("refund:p1", request)["status"] == "succeeded"
    assert payments.submits("refund:p1") == 1
