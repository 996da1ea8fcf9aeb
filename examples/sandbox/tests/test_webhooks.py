"""The sandbox provider's outcome webhooks, as a real process posting to a real HTTP receiver in
this test process: signed per Standard Webhooks (checked with the project's own verifier), retried,
kept across restarts, and the webhook faults (drop, duplicate, delay, reorder)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from examples.sandbox.__main__ import parse_args
from examples.sandbox.process import SandboxProcess
from examples.sandbox.store import Store
from tests.support import wait_for
from webhooks.tests.support import SECRET
from webhooks.verify import SignatureRejected, verify_standard

BODY = {"order": "ORD-7", "amount": "12.50", "currency": "GBP"}
BACKOFF = 0.1  # the first retry's wait; doubled after each
HOLD = 2.0  # the longest a reordered event waits for its burst


@dataclass
class Delivery:
    at: float
    headers: dict[str, str]
    body: bytes

    @property
    def event(self) -> dict[str, Any]:
        return dict(json.loads(self.body))

    @property
    def key(self) -> str:
        return str(self.event["data"]["key"])


@dataclass
class Receiver:
    """Records every POST; answers each key's scripted statuses first, then 202."""

    server: ThreadingHTTPServer
    deliveries: list[Delivery] = field(default_factory=list)
    script: dict[str, list[int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/hooks/"

    def answer(self, delivery: Delivery) -> int:
        with self.lock:
            self.deliveries.append(delivery)
            statuses = self.script.get(delivery.key)
            return statuses.pop(0) if statuses else 202

    def of(self, key: str) -> list[Delivery]:
        with self.lock:
            return [d for d in self.deliveries if d.key == key]

    def wait(self, key: str, n: int = 1, timeout: float = 10) -> list[Delivery]:
        def enough() -> list[Delivery] | None:
            found = self.of(key)
            return found if len(found) >= n else None

        return wait_for(enough, timeout=timeout, what=f"{n} deliveries of {key}")

    def clear(self) -> None:
        with self.lock:
            self.deliveries.clear()
            self.script.clear()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            status = found.answer(Delivery(time.time(), dict(self.headers), body))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    found = Receiver(server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield found
    server.shutdown()
    server.server_close()


def sandbox_process(data: Path, receiver: Receiver, *args: str, faults: str = "") -> SandboxProcess:
    options = ("--webhook-backoff", str(BACKOFF), "--webhook-max-attempts", "4", "--webhook-hold-seconds", str(HOLD))
    return SandboxProcess(
        data,
        webhook_url=receiver.url,
        webhook_secret=SECRET,
        webhook_faults=faults,
        args=(*options, *args),
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[SandboxProcess]:
    with sandbox_process(tmp_path_factory.mktemp("sandbox") / "provider.sqlite3", receiver) as process:
        yield process


@pytest.fixture
def sandbox(server: SandboxProcess, receiver: Receiver) -> SandboxProcess:
    server.reset()
    receiver.clear()
    return server


def refund(sandbox: SandboxProcess, key: str, **changes: str) -> dict[str, Any]:
    status, body = sandbox.request("POST", "/v1/refunds", {**BODY, **changes}, headers={"Idempotency-Key": key})
    assert status == 201, body
    return dict(body)


def event_of(sandbox: SandboxProcess, key: str) -> dict[str, Any]:
    [event] = [e for e in sandbox.webhooks() if e["key"] == key]
    return event


def event_of_file(data: Path) -> dict[str, Any]:
    """The one event in a stopped sandbox's file."""
    [event] = Store(data).webhook_events()
    return event


def verified_id(delivery: Delivery, secret: str = SECRET) -> str:
    return verify_standard(
        headers=delivery.headers, body=delivery.body, secrets=[secret], tolerance=300, now=time.time()
    )


def test_a_refunds_outcome_is_posted_signed_per_standard_webhooks(sandbox: SandboxProcess, receiver: Receiver) -> None:
    # when
    made = refund(sandbox, "k-signed")

    # then one POST, which the project's Standard Webhooks verifier accepts, with the refund as data
    [delivery] = receiver.wait("k-signed")
    event_id = verified_id(delivery)
    assert event_id.startswith("evt_")
    assert delivery.event["type"] == "refund.succeeded"
    assert delivery.event["data"] == made  # the record a lookup answers: key, status, id, amount...
    assert (made["status"], made["key"]) == ("succeeded", "k-signed")
    with pytest.raises(SignatureRejected):
        verified_id(delivery, secret="whsec_" + "b3RoZXItc2VjcmV0LW9mLTE2Yg==")
    # and the outbox says it was delivered at the first attempt
    wait_for(lambda: event_of(sandbox, "k-signed")["status"] == "delivered", what="delivered")
    event = event_of(sandbox, "k-signed")
    assert (event["id"], event["attempts"], event["sends"], event["last_result"]) == (event_id, 1, 1, "202")
    stats = sandbox.stats()
    assert stats["webhooks"]["delivered"] == 1
    assert stats["webhook_sends"] == 1
    # a replay of the request makes no second event
    assert sandbox.request("POST", "/v1/refunds", BODY, headers={"Idempotency-Key": "k-signed"})[0] == 200
    assert len(sandbox.webhooks()) == 1


def test_a_failed_delivery_is_retried_with_backoff_under_the_same_id(
    sandbox: SandboxProcess, receiver: Receiver
) -> None:
    # given a receiver that fails twice (500, then 429), then accepts
    receiver.script["k-retry"] = [500, 429]

    # when
    refund(sandbox, "k-retry")

    # then three attempts, the waits doubling, the same event id each time, each signed afresh
    attempts = receiver.wait("k-retry", 3)
    assert len({verified_id(a) for a in attempts}) == 1
    gaps = [later.at - earlier.at for earlier, later in zip(attempts, attempts[1:], strict=False)]
    assert gaps[0] >= BACKOFF * 0.9 and gaps[1] >= 2 * BACKOFF * 0.9, gaps
    wait_for(lambda: event_of(sandbox, "k-retry")["status"] == "delivered", what="delivered")
    assert event_of(sandbox, "k-retry")["attempts"] == 3
    time.sleep(3 * BACKOFF)
    assert len(receiver.of("k-retry")) == 3  # nothing more once delivered


def test_a_refusal_is_given_up_and_so_is_an_event_out_of_attempts(sandbox: SandboxProcess, receiver: Receiver) -> None:
    # given a receiver that refuses one event (400) and keeps failing the other (503)
    receiver.script["k-refused"] = [400]
    receiver.script["k-down"] = [503] * 10

    # when
    refund(sandbox, "k-refused")
    refund(sandbox, "k-down")

    # then the refused one is failed after one attempt; the other after --webhook-max-attempts (4)
    wait_for(lambda: event_of(sandbox, "k-down")["status"] == "failed", timeout=10, what="given up")
    assert len(receiver.of("k-refused")) == 1
    assert len(receiver.of("k-down")) == 4
    refused, down = event_of(sandbox, "k-refused"), event_of(sandbox, "k-down")
    assert (refused["status"], refused["attempts"], refused["last_result"]) == ("failed", 1, "400")
    assert (down["status"], down["attempts"], down["last_result"]) == ("failed", 4, "503")


def test_drop_duplicate_and_delay(sandbox: SandboxProcess, receiver: Receiver) -> None:
    # given a webhook fault armed for each of three keys
    sandbox.arm("k-drop", "drop", on="webhook")
    sandbox.arm("k-dup", "duplicate", on="webhook")
    sandbox.arm("k-delay", "delay=1", on="webhook")
    assert {"key": "k-dup", "on": "webhook", "fault": "duplicate", "times": 1} in sandbox.request("GET", "/v1/faults")[
        1
    ]["faults"]

    # when
    started = time.time()
    for key in ("k-drop", "k-dup", "k-delay", "k-plain"):
        refund(sandbox, key)

    # then the delayed one comes a second later, the duplicated one twice (same id and body),
    # the dropped one never
    [delayed] = receiver.wait("k-delay")
    assert delayed.at - started >= 1.0
    first, second = receiver.wait("k-dup", 2)
    assert verified_id(first) == verified_id(second) and first.body == second.body
    assert receiver.of("k-plain")[0].at < delayed.at
    assert receiver.of("k-drop") == []
    assert event_of(sandbox, "k-drop")["status"] == "dropped"
    wait_for(lambda: event_of(sandbox, "k-dup")["status"] == "delivered", what="delivered")
    assert (event_of(sandbox, "k-dup")["attempts"], event_of(sandbox, "k-dup")["sends"]) == (1, 2)
    assert sandbox.stats()["armed_faults"] == 0  # each used once


def test_reorder_holds_a_burst_and_sends_it_newest_first(sandbox: SandboxProcess, receiver: Receiver) -> None:
    # given three keys whose events are held until three are
    keys = ["k-r1", "k-r2", "k-r3"]
    for key in keys:
        sandbox.arm(key, "reorder=3", on="webhook")

    # when the first two refunds are made, nothing is sent; the third releases the burst
    refund(sandbox, "k-r1")
    refund(sandbox, "k-r2")
    time.sleep(0.3)
    assert receiver.deliveries == []
    assert sandbox.stats()["webhooks"]["held"] == 2
    refund(sandbox, "k-r3")

    # then all three come, newest first
    for key in keys:
        receiver.wait(key)
    assert [d.key for d in receiver.deliveries] == ["k-r3", "k-r2", "k-r1"]


def test_a_lone_reordered_event_goes_after_the_hold(sandbox: SandboxProcess, receiver: Receiver) -> None:
    sandbox.arm("k-alone", "reorder=5", on="webhook")
    started = time.time()
    refund(sandbox, "k-alone")
    [delivery] = receiver.wait("k-alone", timeout=HOLD + 5)
    assert delivery.at - started >= HOLD * 0.9


@pytest.mark.parametrize(
    "arming",
    [
        {"key": "k", "fault": "timeout", "on": "webhook"},
        {"key": "k", "fault": "reorder=1", "on": "webhook"},
        {"key": "k", "fault": "delay", "on": "webhook"},
        {"key": "k", "fault": "duplicate=2", "on": "webhook"},
        {"key": "k", "fault": "drop", "on": "create"},
    ],
)
def test_invalid_webhook_arming_is_422(sandbox: SandboxProcess, arming: dict[str, Any]) -> None:
    status, body = sandbox.request("POST", "/v1/faults", arming)
    assert (status, body["error"]) == (422, "invalid_request")


def test_queued_events_survive_a_restart_and_are_delivered_after_it(tmp_path: Path, receiver: Receiver) -> None:
    # given an event the receiver refused with 503, its retry a second away, and the sandbox
    # stopped before it
    receiver.clear()
    receiver.script["k-durable"] = [503] * 10
    with sandbox_process(tmp_path / "provider.sqlite3", receiver, "--webhook-backoff", "1") as process:
        refund(process, "k-durable")
        [first] = receiver.wait("k-durable")
        assert process.stop() == 0
        assert event_of_file(tmp_path / "provider.sqlite3")["status"] == "queued"

        # when the receiver is well again and the sandbox starts again on the same file
        receiver.script.clear()
        process.start()

        # then the event is delivered, under the same id, its attempts counted across the restart
        second = receiver.wait("k-durable", 2)[1]
        assert verified_id(second) == verified_id(first)
        wait_for(lambda: event_of(process, "k-durable")["status"] == "delivered", what="delivered")
        assert event_of(process, "k-durable")["attempts"] == 2


def test_a_pending_refund_settles_later_with_its_webhook(tmp_path: Path, receiver: Receiver) -> None:
    receiver.clear()
    with sandbox_process(tmp_path / "provider.sqlite3", receiver, "--settle-after", "0.5") as process:
        # when a refund is made, and one above the decline limit
        made = refund(process, "k-later")
        big = refund(process, "k-later-big", amount="20000.00")

        # then both are answered pending, and nothing is posted yet
        assert (made["status"], big["status"]) == ("pending", "pending")
        assert process.stats()["pending"] == 2
        assert receiver.deliveries == []

        # and each settles with its outcome's webhook: succeeded, and failed (declined)
        [ok] = receiver.wait("k-later")
        [declined] = receiver.wait("k-later-big")
        assert ok.event["type"] == "refund.succeeded" and ok.event["data"]["status"] == "succeeded"
        assert declined.event["type"] == "refund.failed"
        assert declined.event["data"]["status"] == "failed"
        assert declined.event["data"]["failure_reason"] == "declined"
        assert process.request("GET", "/v1/refunds?key=k-later") == (200, ok.event["data"])
        assert process.stats()["pending"] == 0


def test_the_command_line_refuses_a_webhook_without_a_usable_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDBOX_WEBHOOK_SECRET", raising=False)
    for argv in (
        ["--webhook-url", "http://127.0.0.1:1/hooks/"],
        ["--webhook-url", "http://127.0.0.1:1/hooks/", "--webhook-secret", "whsec_not base64!"],
        ["--webhook-url", "ftp://example.com/", "--webhook-secret", SECRET],
        ["--webhook-faults", "reorder,explode"],
    ):
        with pytest.raises(SystemExit):
            parse_args(argv)
    monkeypatch.setenv("SANDBOX_WEBHOOK_SECRET", SECRET)
    args = parse_args(["--webhook-url", "http://127.0.0.1:1/hooks/", "--webhook-faults", "reorder, delay=2"])
    assert (args.webhook_secret, args.webhook_faults) == (SECRET, ("reorder", "delay=2"))
