"""What HttpAdapter makes of each kind of answer (pure logic; the HTTP paths themselves are
exercised against the real fake provider in test_services and test_reconcile)."""
from __future__ import annotations

from typing import Any

import httpx
import pytest

from ledger import Failed, HttpAdapter, NoEffect, NotFound, Succeeded, Unknown
from ledger.apps import check_timeouts

ADAPTER = HttpAdapter(base_url="http://provider.invalid/")


def answer(status: int, body: Any = None) -> httpx.Response:
    return httpx.Response(status, json=body) if body is not None else httpx.Response(status, text="oops")


@pytest.mark.parametrize(("status", "body", "expected"), [
    (201, {"id": "re_1", "status": "succeeded"}, Succeeded({"id": "re_1", "status": "succeeded"})),
    (200, {"id": "re_1"}, Succeeded({"id": "re_1"})),
    (200, None, Succeeded({"body": "oops"})),  # it did succeed, whatever the body says
    (200, {"status": "declined", "reason": "insufficient_funds"},
     Failed("insufficient_funds", {"status": "declined", "reason": "insufficient_funds"})),
    (202, {"status": "processing"}, Unknown("the provider says the operation is processing")),
    (422, {"error": {"code": "card_declined"}}, Failed("card_declined", {"error": {"code": "card_declined"}})),
    (400, {"error": "bad amount"}, Failed("bad amount", {"error": "bad amount"})),
    (403, None, Failed("http_403", {"body": "oops"})),
    (429, None, NoEffect("the provider refused it before acting (HTTP 429, too many requests)")),
])
def test_definitive_submit_answers(status: int, body: Any, expected: Any) -> None:
    assert ADAPTER.submit_outcome(answer(status, body)) == expected


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
    settings.LEDGER = {**settings.LEDGER, "CONNECT_TIMEOUT": 5.0, "READ_TIMEOUT": 30.0,
                       "STALE_SUBMITTED_SECONDS": 60.0}
    [error] = check_timeouts()
    assert error.id == "ledger.E001"

    settings.LEDGER = {**settings.LEDGER, "STALE_SUBMITTED_SECONDS": 120.0}
    assert check_timeouts() == []
