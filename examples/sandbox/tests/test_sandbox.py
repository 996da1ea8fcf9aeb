"""The sandbox payment provider as a real process on a real port, spoken to over HTTP."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from examples.sandbox.process import ROOT, SandboxProcess

REFUNDS = "/v1/refunds"
BODY = {"order": "ORD-1001", "amount": "120.00", "currency": "GBP"}
TIMEOUT_SECONDS = 3.0  # the server's default for the ``timeout`` fault in these tests


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    data = tmp_path_factory.mktemp("sandbox") / "provider.sqlite3"
    with SandboxProcess(data, args=("--timeout-seconds", str(TIMEOUT_SECONDS))) as process:
        yield process


@pytest.fixture
def sandbox(server: SandboxProcess) -> SandboxProcess:
    server.reset()
    return server


def create(
    sandbox: SandboxProcess, key: str, body: Any = None, fault: str | None = None, timeout: float = 10.0
) -> tuple[int, Any]:
    headers = {"Idempotency-Key": key}
    if fault is not None:
        headers["X-Sandbox-Fault"] = fault
    return sandbox.request("POST", REFUNDS, BODY if body is None else body, headers=headers, timeout=timeout)


def lookup(sandbox: SandboxProcess, key: str, fault: str | None = None) -> tuple[int, Any]:
    headers = {} if fault is None else {"X-Sandbox-Fault": fault}
    return sandbox.request("GET", f"{REFUNDS}?key={key}", headers=headers)


# -- idempotency -------------------------------------------------------------------------------


def test_same_key_twice_makes_one_refund(sandbox: SandboxProcess) -> None:
    # when
    first_status, first = create(sandbox, "refund:ORD-1001:r1")
    second_status, second = create(sandbox, "refund:ORD-1001:r1", {**BODY, "amount": "120"})  # same amount

    # then
    assert first_status == 201
    assert first["status"] == "succeeded"
    assert {k: first[k] for k in ("key", "order", "amount", "currency")} == {
        "key": "refund:ORD-1001:r1",
        "order": "ORD-1001",
        "amount": "120.00",
        "currency": "GBP",
    }
    assert first["id"].startswith("re_") and first["created_at"].endswith("Z")
    assert (second_status, second) == (200, first)
    stats = sandbox.stats()
    assert stats["refunds"] == 1
    assert stats["requests"] == {"created": 1, "replayed": 1}
    assert sandbox.request("GET", REFUNDS) == (200, {"count": 1, "refunds": [first]})


def test_same_key_different_body_conflicts(sandbox: SandboxProcess) -> None:
    # given
    _, refund = create(sandbox, "k-conflict")

    # when
    status, body = create(sandbox, "k-conflict", {**BODY, "amount": "99.99"})

    # then: refused, and the stored refund is unchanged
    assert status == 409
    assert body["error"] == "idempotency_conflict"
    assert lookup(sandbox, "k-conflict") == (200, refund)
    assert sandbox.stats()["refunds"] == 1


def test_lookup_by_key(sandbox: SandboxProcess) -> None:
    # given
    _, refund = create(sandbox, "k-lookup")

    # then
    assert lookup(sandbox, "k-lookup") == (200, refund)
    status, body = lookup(sandbox, "k-unknown")
    assert status == 404
    assert body["error"] == "not_found"
    assert sandbox.stats()["requests"] == {"created": 1, "found": 1, "not_found": 1}


def test_lookup_of_many_keys_in_one_request(sandbox: SandboxProcess) -> None:
    # given two refunds
    _, first = create(sandbox, "k-many-1")
    _, second = create(sandbox, "k-many-2")

    # when three keys are looked up at once
    status, body = sandbox.request("POST", "/v1/refunds/lookup", {"keys": ["k-many-1", "k-never", "k-many-2"]})

    # then the two refunds are found and the third key is missing; nothing was created
    assert status == 200
    assert body == {"found": {"k-many-1": first, "k-many-2": second}, "missing": ["k-never"]}
    assert sandbox.stats()["refunds"] == 2
    bad: dict[str, Any]
    for bad in ({"keys": []}, {"keys": "k"}, {"keys": [1]}, {}, {"keys": ["k"] * 1001}):
        assert sandbox.request("POST", "/v1/refunds/lookup", bad)[0] == 422


def test_currency_defaults_to_gbp(sandbox: SandboxProcess) -> None:
    status, body = create(sandbox, "k-gbp", {"order": "ORD-1", "amount": "5"})
    assert (status, body["currency"], body["amount"]) == (201, "GBP", "5.00")


# -- bad requests and declines -----------------------------------------------------------------


def test_missing_idempotency_key_is_400(sandbox: SandboxProcess) -> None:
    status, body = sandbox.request("POST", REFUNDS, BODY)
    assert status == 400
    assert body["error"] == "missing_idempotency_key"
    assert sandbox.stats()["refunds"] == 0


def test_body_that_is_not_json_is_400(sandbox: SandboxProcess) -> None:
    status, body = sandbox.request("POST", REFUNDS, b"{order: 1", headers={"Idempotency-Key": "k"})
    assert (status, body["error"]) == (400, "invalid_json")
    status, body = sandbox.request("POST", REFUNDS, "an order", headers={"Idempotency-Key": "k"})
    assert (status, body["error"]) == (422, "invalid_request")  # JSON, but not an object
    assert sandbox.stats()["refunds"] == 0


@pytest.mark.parametrize(
    "change",
    [
        {"amount": "0"},
        {"amount": "0.00"},
        {"amount": "-1.00"},
        {"amount": "1.234"},
        {"amount": "abc"},
        {"amount": "1e3"},
        {"amount": ""},
        {"amount": 12},
        {"amount": 12.5},
        {"amount": None},
        {"order": ""},
        {"order": 7},
        {"currency": "gbp"},
        {"currency": "POUNDS"},
        {"surprise": 1},
    ],
)
def test_invalid_refund_is_422_and_stores_nothing(sandbox: SandboxProcess, change: dict[str, Any]) -> None:
    # when
    status, body = create(sandbox, "k-invalid", {**BODY, **change})

    # then
    assert status == 422, body
    assert body["error"] == "invalid_request"
    assert lookup(sandbox, "k-invalid")[0] == 404
    assert sandbox.stats()["refunds"] == 0


def test_amount_above_limit_is_declined_and_stores_nothing(sandbox: SandboxProcess) -> None:
    # when
    status, body = create(sandbox, "k-big", {**BODY, "amount": "10000.01"})

    # then: a definitive refusal; the limit itself is allowed
    assert (status, body["error"]) == (402, "declined")
    assert lookup(sandbox, "k-big")[0] == 404
    assert create(sandbox, "k-limit", {**BODY, "amount": "10000.00"})[0] == 201
    assert sandbox.stats()["refunds"] == 1


# -- faults by header --------------------------------------------------------------------------


def test_delay_fault_answers_normally_after_the_delay(sandbox: SandboxProcess) -> None:
    # when
    started = time.monotonic()
    status, body = create(sandbox, "k-delay", fault="delay=0.6")
    elapsed = time.monotonic() - started

    # then
    assert status == 201
    assert elapsed >= 0.6
    assert sandbox.stats()["faults"] == {"delay": 1}


def test_timeout_fault_stores_the_refund_but_the_client_times_out(sandbox: SandboxProcess) -> None:
    # when: the provider commits, then holds the answer back past the client's read timeout
    with pytest.raises(TimeoutError):
        create(sandbox, "k-timeout", fault="timeout", timeout=1.0)

    # then: a lookup finds the refund, and retrying with the same key makes no second one
    status, refund = lookup(sandbox, "k-timeout")
    assert status == 200
    assert refund["key"] == "k-timeout"
    assert create(sandbox, "k-timeout") == (200, refund)
    stats = sandbox.stats()
    assert stats["refunds"] == 1
    assert stats["requests"]["created"] == 1
    assert stats["faults"] == {"timeout": 1}


def test_timeout_fault_answers_a_patient_client(sandbox: SandboxProcess) -> None:
    started = time.monotonic()
    status, body = create(sandbox, "k-patient", fault="timeout=0.3", timeout=5)
    assert (status, body["key"]) == (201, "k-patient")
    assert time.monotonic() - started >= 0.3


def test_error_fault_stores_nothing(sandbox: SandboxProcess) -> None:
    # when
    status, body = create(sandbox, "k-error", fault="error")

    # then
    assert (status, body["error"]) == (500, "internal_error")
    assert lookup(sandbox, "k-error")[0] == 404
    assert sandbox.stats()["refunds"] == 0
    assert create(sandbox, "k-error")[0] == 201  # a retry really creates it


def test_error_after_commit_fault_stores_the_refund(sandbox: SandboxProcess) -> None:
    # when
    status, body = create(sandbox, "k-eac", fault="error-after-commit")

    # then: the client saw 503, but the effect happened exactly once
    assert (status, body["error"]) == (503, "service_unavailable")
    found_status, refund = lookup(sandbox, "k-eac")
    assert found_status == 200
    assert create(sandbox, "k-eac") == (200, refund)
    assert sandbox.stats()["refunds"] == 1


def test_reject_fault_declines_and_stores_nothing(sandbox: SandboxProcess) -> None:
    status, body = create(sandbox, "k-reject", fault="reject")
    assert (status, body["error"]) == (402, "declined")
    assert lookup(sandbox, "k-reject")[0] == 404
    assert sandbox.stats()["refunds"] == 0


@pytest.mark.parametrize("fault", ["bogus", "delay", "delay=abc", "delay=-1", "error=3", "timeout=nan"])
def test_malformed_fault_header_is_400(sandbox: SandboxProcess, fault: str) -> None:
    status, body = create(sandbox, "k-bad-fault", fault=fault)
    assert (status, body["error"]) == (400, "invalid_fault")
    assert sandbox.stats()["refunds"] == 0


def test_lookup_faults(sandbox: SandboxProcess) -> None:
    # given
    _, refund = create(sandbox, "k-lf")

    # then: a lookup can fail or time out; it cannot be "rejected"
    assert lookup(sandbox, "k-lf", fault="error")[0] == 500
    with pytest.raises(TimeoutError):
        sandbox.request("GET", f"{REFUNDS}?key=k-lf", headers={"X-Sandbox-Fault": "timeout=1"}, timeout=0.3)
    assert lookup(sandbox, "k-lf", fault="delay=0.1") == (200, refund)
    assert lookup(sandbox, "k-lf", fault="reject")[0] == 400


# -- armed faults ------------------------------------------------------------------------------


def test_armed_faults_are_consumed_in_order(sandbox: SandboxProcess) -> None:
    # given: the next two creates on the key fail, the third commits but answers 503
    sandbox.arm("k-armed", "error", times=2)
    sandbox.arm("k-armed", "error-after-commit")
    sandbox.arm("k-other", "reject")
    assert sandbox.request("GET", "/v1/faults")[1]["faults"] == [
        {"key": "k-armed", "on": "create", "fault": "error", "times": 2},
        {"key": "k-armed", "on": "create", "fault": "error-after-commit", "times": 1},
        {"key": "k-other", "on": "create", "fault": "reject", "times": 1},
    ]

    # when
    statuses = [create(sandbox, "k-armed")[0] for _ in range(4)]

    # then: 500, 500, 503 (stored), then the stored refund; the other key's fault is untouched
    assert statuses == [500, 500, 503, 200]
    assert sandbox.request("GET", "/v1/faults")[1]["faults"] == [
        {"key": "k-other", "on": "create", "fault": "reject", "times": 1}
    ]
    stats = sandbox.stats()
    assert stats["refunds"] == 1
    assert stats["faults"] == {"error": 2, "error-after-commit": 1}
    assert stats["requests"] == {"error": 2, "created": 1, "replayed": 1}


def test_header_fault_takes_precedence_over_armed_fault(sandbox: SandboxProcess) -> None:
    # given
    sandbox.arm("k-prec", "reject")

    # when: a request with its own fault header leaves the armed fault in place
    assert create(sandbox, "k-prec", fault="delay=0")[0] == 201

    # then: the next plain request uses it up
    assert sandbox.stats()["armed_faults"] == 1
    assert create(sandbox, "k-prec")[0] == 402
    assert sandbox.stats()["armed_faults"] == 0
    assert create(sandbox, "k-prec")[0] == 200


def test_armed_timeout_uses_the_server_default(sandbox: SandboxProcess) -> None:
    # given
    sandbox.arm("k-at", "timeout")

    # then
    with pytest.raises(TimeoutError):
        create(sandbox, "k-at", timeout=1.0)
    assert lookup(sandbox, "k-at")[0] == 200
    assert sandbox.stats()["refunds"] == 1


def test_armed_lookup_fault(sandbox: SandboxProcess) -> None:
    # given
    create(sandbox, "k-al")
    sandbox.arm("k-al", "error", on="lookup")

    # then: only the lookup fails, once
    assert lookup(sandbox, "k-al")[0] == 500
    assert lookup(sandbox, "k-al")[0] == 200


@pytest.mark.parametrize(
    "arming",
    [
        {"key": "k", "fault": "bogus"},
        {"key": "k", "fault": "error", "times": 0},
        {"key": "k", "fault": "error", "times": "2"},
        {"key": "", "fault": "error"},
        {"key": "k", "fault": "reject", "on": "lookup"},
        {"key": "k", "fault": "error", "on": "refund"},
    ],
)
def test_invalid_arming_is_422(sandbox: SandboxProcess, arming: dict[str, Any]) -> None:
    status, body = sandbox.request("POST", "/v1/faults", arming)
    assert (status, body["error"]) == (422, "invalid_request")
    assert sandbox.stats()["armed_faults"] == 0


# -- concurrency, restarts, reset, the log -----------------------------------------------------


def test_concurrent_creates_with_one_key_make_one_refund(sandbox: SandboxProcess) -> None:
    # given
    barrier = threading.Barrier(10)
    results: list[tuple[int, Any]] = []
    lock = threading.Lock()

    def post() -> None:
        barrier.wait()
        result = create(sandbox, "k-race")
        with lock:
            results.append(result)

    # when
    threads = [threading.Thread(target=post) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    # then: one 201, nine replays of the same refund
    assert sorted(status for status, _ in results) == [200] * 9 + [201]
    assert len({body["id"] for _, body in results}) == 1
    stats = sandbox.stats()
    assert stats["refunds"] == 1
    assert stats["requests"] == {"created": 1, "replayed": 9}


def test_state_survives_a_restart(tmp_path: Path) -> None:
    # given
    with SandboxProcess(tmp_path / "provider.sqlite3") as process:
        _, refund = create(process, "k-durable")
        process.arm("k-later", "error")
        first_port = process.port

        # when: the process is stopped (SIGTERM) and started again on the same file
        assert process.stop() == 0
        process.start()

        # then
        assert first_port is not None and process.port is not None
        assert lookup(process, "k-durable") == (200, refund)
        assert create(process, "k-durable") == (200, refund)
        assert create(process, "k-later")[0] == 500  # the armed fault survived too
        stats = process.stats()
        assert stats["refunds"] == 1
        assert stats["requests"] == {"created": 1, "found": 1, "replayed": 1, "error": 1}


def test_reset_forgets_everything(sandbox: SandboxProcess) -> None:
    # given
    create(sandbox, "k-reset")
    sandbox.arm("k-reset", "error")

    # when
    sandbox.reset()

    # then
    assert sandbox.stats() == {
        "refunds": 0,
        "pending": 0,
        "requests": {},
        "faults": {},
        "armed_faults": 0,
        "webhooks": {"held": 0, "queued": 0, "delivered": 0, "failed": 0, "dropped": 0},
        "webhook_sends": 0,
    }
    assert create(sandbox, "k-reset")[0] == 201


def test_each_request_logs_one_line_without_the_body(sandbox: SandboxProcess) -> None:
    # given
    offset = len(sandbox.log_text())

    # when
    create(sandbox, "k-log", {**BODY, "order": "ORD-PRIVATE-77", "reason": "Jane Doe, 1 High St"})
    create(sandbox, "k-log2", fault="reject")

    # then
    lines = sandbox.log_text()[offset:].splitlines()
    assert any(" POST /v1/refunds key=k-log fault=- status=201 outcome=created " in line for line in lines), lines
    assert any(" POST /v1/refunds key=k-log2 fault=reject status=402 outcome=declined " in line for line in lines)
    assert not any("ORD-PRIVATE-77" in line or "Jane" in line or "120.00" in line for line in lines)


def test_routes(sandbox: SandboxProcess) -> None:
    assert sandbox.request("GET", "/v1/nothing")[0] == 404
    status, body = sandbox.request("DELETE", REFUNDS)
    assert (status, body["error"]) == (405, "method_not_allowed")


def test_the_provider_does_not_import_django() -> None:
    code = (
        "import sys, examples.sandbox.__main__, examples.sandbox.process; "
        "sys.exit(1 if any(m == 'django' or m.startswith('django.') for m in sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60).returncode == 0
