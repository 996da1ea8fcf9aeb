"""What HttpAdapter makes of each kind of answer (pure logic; the HTTP paths themselves are
exercised against the real fake provider in test_services and test_reconcile), and, over real
HTTP, a provider without the optional batch lookup."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from ledger import (
    Failed,
    HttpAdapter,
    NoEffect,
    NotFound,
    Succeeded,
    Unknown,
    http,
    register_adapter,
    unregister_adapter,
)
from ledger.adapters import has_lookup_many
from ledger.apps import check_timeouts
from ledger.models import ExternalOperation, OperationStatus
from ledger.services import operations_reconcile
from ledger.tests.provider import FakeProvider
from ledger.tests.support import make_operation

ADAPTER = HttpAdapter(base_url="http://provider.invalid/")


def answer(status: int, body: Any = None) -> httpx.Response:
    return httpx.Response(status, json=body) if body is not None else httpx.Response(status, text="oops")


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (201, {"id": "re_1", "status": "succeeded"}, Succeeded({"id": "re_1", "status": "succeeded"})),
        (200, {"id": "re_1"}, Succeeded({"id": "re_1"})),
        # a success that says nothing of the operation: what submit() makes of it is below
        (200, None, Succeeded({"body": "oops", "_not_json": True})),
        (
            200,
            {"status": "declined", "reason": "insufficient_funds"},
            Failed("insufficient_funds", {"status": "declined", "reason": "insufficient_funds"}),
        ),
        (202, {"status": "processing"}, Unknown("the provider says the operation is processing")),
        (422, {"error": {"code": "card_declined"}}, Failed("card_declined", {"error": {"code": "card_declined"}})),
        (400, {"error": "bad amount"}, Failed("bad amount", {"error": "bad amount"})),
        (403, None, Failed("http_403", {"body": "oops", "_not_json": True})),
        (429, None, NoEffect("the provider refused it before acting (HTTP 429, too many requests)")),
    ],
)
def test_definitive_submit_answers(status: int, body: Any, expected: Any) -> None:
    assert ADAPTER.submit_outcome(answer(status, body)) == expected


@pytest.mark.parametrize(
    ("outcome", "believed"),
    [
        # our record: believed
        (Succeeded({"key": "refund:1042:7", "amount": "90.00", "status": "succeeded"}), True),
        (Succeeded({"id": "re_1", "amount": 90, "currency": "GBP"}), True),  # the same amount written otherwise
        (Failed("declined", {"key": "refund:1042:7", "status": "declined"}), True),
        # another operation's record under our key (another installation, ids reused): unknown
        (Succeeded({"key": "refund:1042:7", "amount": "1.00", "status": "succeeded"}), False),
        (Succeeded({"key": "refund:9999:1", "status": "succeeded"}), False),
        (Succeeded({"id": "re_1", "currency": "EUR"}), False),
        (Failed("declined", {"key": "refund:9999:1"}), False),
        # a 200 page that is not JSON (a misconfigured URL, a proxy) says nothing of the operation
        (Succeeded({"body": "<html>welcome</html>", "_not_json": True}), False),
    ],
)
def test_an_outcome_is_believed_only_on_the_operations_own_record(outcome: Any, believed: bool) -> None:
    op = ExternalOperation(key="refund:1042:7", request={"order": "1042", "amount": "90.00", "currency": "GBP"})

    result = ADAPTER.believed(op, outcome)

    assert (result == outcome) is believed
    if not believed:
        assert isinstance(result, Unknown) and ("not this operation's" in result.reason or "not JSON" in result.reason)


@pytest.mark.parametrize("status", [408, 409, 425, 500, 502, 503, 504])
def test_answers_that_do_not_say_whether_it_happened_are_unknown(status: int) -> None:
    outcome = ADAPTER.submit_outcome(answer(status, {"error": "x"}))
    assert isinstance(outcome, Unknown) and f"HTTP {status}" in outcome.reason


def test_lookup_answers() -> None:
    assert ADAPTER.lookup_outcome(answer(404, {"error": "not_found"})) == NotFound()
    assert ADAPTER.lookup_outcome(answer(200, {"status": "succeeded"})) == Succeeded({"status": "succeeded"})
    assert isinstance(ADAPTER.lookup_outcome(answer(200, {"status": "failed"})), Failed)
    assert ADAPTER.lookup_outcome(answer(500, {})) == Unknown("the lookup answered HTTP 500")


def test_paths_quote_the_key_and_timeouts_come_from_settings(settings: Any) -> None:
    from ledger.models import ExternalOperation

    settings.LEDGER = {**settings.LEDGER, "CONNECT_TIMEOUT": 1.5, "READ_TIMEOUT": 7.0}
    op = ExternalOperation(key="refund:1042/r 1", action="refund")

    assert ADAPTER.url("/{action}/{key}", op) == "http://provider.invalid/refund/refund%3A1042%2Fr%201"
    timeout = ADAPTER.timeout()
    assert (timeout.connect, timeout.read, timeout.write, timeout.pool) == (1.5, 7.0, 7.0, 1.5)
    assert HttpAdapter(base_url="http://x", read_timeout=2.0).timeout().read == 2.0
    assert HttpAdapter(base_url="http://x", lookup_path=None).can_lookup is False


def test_a_stale_age_shorter_than_a_call_is_a_configuration_error(settings: Any) -> None:
    settings.LEDGER = {**settings.LEDGER, "CONNECT_TIMEOUT": 5.0, "READ_TIMEOUT": 30.0, "STALE_SUBMITTED_SECONDS": 60.0}
    [error] = check_timeouts()
    assert error.id == "ledger.E001"

    settings.LEDGER = {**settings.LEDGER, "STALE_SUBMITTED_SECONDS": 120.0}
    assert check_timeouts() == []


# --- a provider without the batch lookup, over real HTTP --------------------------------------------
NO_BATCH = [
    pytest.param("/{action}/lookup", id="405: the path is the lookup route, GET only"),
    pytest.param("/batch/{action}/lookup", id="404: no such path"),
]


@pytest.mark.parametrize("batch_path", NO_BATCH)
def test_without_the_batch_path_each_key_is_looked_up_on_its_own_and_the_path_is_not_asked_again(
    provider: FakeProvider, ledger_settings: Any, batch_path: str
) -> None:
    # given a provider that did one key, declined another, never saw a third, and has no batch lookup
    paid, declined = provider.seed("k-paid"), provider.seed("k-declined", status="failed", reason="card_declined")
    adapter = HttpAdapter(base_url=provider.url, batch_lookup_path=batch_path)
    ops = [ExternalOperation(key=key, system="payments", action="refund") for key in ("k-paid", "k-declined", "k-new")]
    expected = [Succeeded(paid), Failed("card_declined", declined), NotFound()]

    # when a batch is looked up
    outcomes = adapter.lookup_many(ops)

    # then the batch path was tried once, and each key looked up on its own: nothing left "unknown"
    assert outcomes == expected
    assert (provider.batch_lookups(), provider.lookups()) == (1, 3)
    assert not adapter.can_lookup_many and not has_lookup_many(adapter)

    # and later batches go straight to single lookups
    assert adapter.lookup_many(ops) == expected
    assert (provider.batch_lookups(), provider.lookups()) == (1, 6)


def test_a_lookup_threads_kept_alive_connection_is_closed_when_the_thread_ends(
    provider: FakeProvider, ledger_settings: Any
) -> None:
    # given a lookup made in a thread of its own (as reconciliation's pool of lookup threads makes them)
    provider.seed("k-paid")
    adapter = HttpAdapter(base_url=provider.url)
    op = ExternalOperation(key="k-paid", system="payments", action="refund")
    clients: list[httpx.Client] = []

    def look_up() -> None:
        assert isinstance(adapter.lookup(op), Succeeded)
        clients.extend(http._lookup_clients.clients.values())

    # when the thread ends
    thread = threading.Thread(target=look_up)
    thread.start()
    thread.join(timeout=30)

    # then its kept-alive client was closed with it, not left for the collector to find
    assert len(clients) == 1 and clients[0].is_closed


def test_a_provider_with_the_batch_path_is_asked_once_a_batch(ledger_settings: Any, tmp_path: Any) -> None:
    """The same adapter against the sandbox, which has the batch lookup: one request, no single lookups."""
    from examples.sandbox.process import SandboxProcess

    with SandboxProcess(tmp_path / "sandbox.sqlite3") as sandbox:
        sandbox.request(
            "POST",
            "/v1/refunds",
            {"order": "A1", "amount": "5.00", "currency": "GBP"},
            headers={"Idempotency-Key": "k-paid"},
        )
        adapter = HttpAdapter(
            base_url=sandbox.url,
            submit_path="/v1/{action}s",
            lookup_path="/v1/{action}s?key={key}",
            batch_lookup_path="/v1/{action}s/lookup",
        )
        ops = [ExternalOperation(key=key, system="payments", action="refund") for key in ("k-paid", "k-new")]

        outcomes = adapter.lookup_many(ops)

        assert [type(outcome) for outcome in outcomes] == [Succeeded, NotFound]
        assert adapter.can_lookup_many and has_lookup_many(adapter)
        requests = sandbox.stats()["requests"]
        assert requests.get("batch_lookup") == 1 and "found" not in requests and "not_found" not in requests


@pytest.mark.django_db
def test_reconcile_resolves_everything_at_a_provider_without_the_batch_path(
    provider: FakeProvider, ledger_settings: Any
) -> None:
    # given unknown operations the provider did, and an adapter configured with a batch path it lacks
    register_adapter("payments", HttpAdapter(base_url=provider.url, batch_lookup_path="/{action}/lookup"))
    first = [make_operation(f"paid-{n}") for n in range(3)]
    for op in first:
        provider.seed(op.key)

    # when reconcile runs, and runs again for more
    try:
        operations_reconcile()
        later = [make_operation(f"paid-{n}") for n in range(3, 6)]
        for op in later:
            provider.seed(op.key)
        operations_reconcile()
    finally:
        unregister_adapter("payments")  # as the payments fixture does

    # then every operation is resolved from a lookup of its own, and the batch path was asked once
    statuses = set(
        ExternalOperation.objects.filter(pk__in=[op.pk for op in first + later]).values_list("status", flat=True)
    )
    assert statuses == {OperationStatus.SUCCEEDED}
    assert (provider.batch_lookups(), provider.lookups()) == (1, 6)


def test_an_outcome_names_the_provider_without_its_credentials() -> None:
    # given a provider whose address carries a key, and which no one answers at
    adapter = HttpAdapter(base_url="http://user:s3cret@127.0.0.1:9/v1?token=t0ken", connect_timeout=0.5)
    op = ExternalOperation(key="refund:1", system="payments", action="refund", request={"amount": "1.00"})

    # when a refund is sent and a lookup made
    outcomes = [adapter.submit(op), adapter.lookup(op)]

    # then the reasons stored and logged name the provider by its address alone
    for outcome in outcomes:
        assert isinstance(outcome, (NoEffect, Unknown)), outcome
        assert "http://127.0.0.1:9/v1" in outcome.reason
        assert "s3cret" not in outcome.reason and "user" not in outcome.reason and "t0ken" not in outcome.reason
