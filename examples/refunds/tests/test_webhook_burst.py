"""The sandbox provider's own outcome webhooks, end to end: a burst of refunds whose answers time
out (their operations unknown, their lookups failing) is settled by the webhooks the provider posts
to a real daphne, reordered and duplicated on the way: every refund settles once.

Real processes throughout: the sandbox provider (posting signed webhooks to daphne's
``/webhooks/sandbox-payments/``, the source the settings make from ``SANDBOX_WEBHOOK_SECRET``, as
``scripts/run.sh`` wires them), daphne, and the refund tests' Celery workers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from examples.refunds.models import RefundRequest
from examples.refunds.tests.conftest import World
from examples.refunds.tests.support import ask, assert_confirmed, new_order
from examples.sandbox.process import SandboxProcess
from ledger.models import ExternalOperation, OperationEvent, OperationStatus
from tests.factories import Users
from tests.support import AsgiServer, serving, wait_for
from webhooks.models import WebhookDelivery
from webhooks.tests.support import SECRET

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

N = 10
SOURCE = "sandbox-payments"  # the settings' default source for the sandbox's webhooks


@pytest.fixture(scope="module")
def daphne(django_db_setup: None, django_db_blocker: Any) -> Iterator[AsgiServer]:
    # The secret as scripts/run.sh gives it: one variable, read by the settings and by the sandbox.
    with serving(django_db_blocker, SANDBOX_WEBHOOK_SECRET=SECRET) as server:
        yield server


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory, daphne: AsgiServer) -> Iterator[SandboxProcess]:
    """The refund tests' provider (conftest's workers call it), posting its outcome webhooks to
    daphne; every event is duplicated, and held until N + 1 are, then sent newest first."""
    with SandboxProcess(
        tmp_path_factory.mktemp("sandbox") / "sandbox.sqlite3",
        webhook_url=f"{daphne.url}/webhooks/{SOURCE}/",
        webhook_secret=SECRET,
        webhook_faults=f"reorder={N + 1},duplicate",
        args=("--webhook-hold-seconds", "120"),
    ) as process:
        yield process


def settled_events(op: ExternalOperation) -> int:
    """How many times the operation was moved to a final state (one outcome: once)."""
    final = [OperationStatus.SUCCEEDED, OperationStatus.FAILED]
    return OperationEvent.objects.filter(operation=op, status_after__in=final).exclude(status_before__in=final).count()


def test_a_reordered_and_duplicated_burst_of_webhooks_settles_every_refund_once(
    world: World, users: Users, settings: Any
) -> None:
    settings.REFUND_MAX_OPEN_REQUESTS = 2 * N
    sandbox = world.sandbox

    # given N refunds the provider makes but whose answers time out, and whose lookups fail: only
    # the provider's webhook can tell how they ended
    requests = [
        ask(
            new_order(users.alice, f"36{i:02d}", "50.00"),
            "20.00",
            sandbox=sandbox,
            faults=(("timeout=3", "create", 1, "answer lost"), ("error", "lookup", 100, "no lookups")),
            retry_delay_seconds=0.5,
            check_interval_seconds=2,
        )
        for i in range(N)
    ]
    keys = [r.operation_key for r in requests]
    wait_for(
        lambda: ExternalOperation.objects.filter(key__in=keys, status=OperationStatus.UNKNOWN).count() == N,
        timeout=60,
        what="every refund's outcome to be unknown",
    )
    # the provider holds their N events meanwhile
    assert sandbox.stats()["webhooks"]["held"] == N
    assert WebhookDelivery.objects.count() == 0

    # when one more refund at the provider (not ours) completes the burst of N + 1: it is released,
    # newest first, each event sent twice
    status, _ = sandbox.request(
        "POST", "/v1/refunds", {"order": "ELSEWHERE", "amount": "1.00"}, headers={"Idempotency-Key": "theirs"}
    )
    assert status == 201

    # then every run completes with its refund confirmed
    for request in requests:
        assert_confirmed(request, sandbox, provider_refunds=None)
    # one refund per key at the provider, and every event delivered, twice
    _, listed = sandbox.request("GET", "/v1/refunds")
    assert Counter(r["key"] for r in listed["refunds"]) == Counter([*keys, "theirs"])
    events = sandbox.webhooks()
    assert [(e["status"], e["sends"]) for e in events] == [("delivered", 2)] * (N + 1)
    # each operation settled exactly once, by its webhook: unknown to succeeded, noted as reported
    for key in keys:
        op = ExternalOperation.objects.get(key=key)
        assert op.status == OperationStatus.SUCCEEDED
        assert settled_events(op) == 1
        assert f"reported by webhook {SOURCE}" in op.note
        [accepted] = WebhookDelivery.objects.filter(operation_key=key, outcome="accepted")
        assert accepted.result is not None
        assert (accepted.result["changed"], accepted.result["before"], accepted.result["after"]) == (
            True,
            "unknown",
            "succeeded",
        )
    # not by a lookup: the provider never answered one (they all failed)
    assert sandbox.stats()["requests"].get("found", 0) == 0
    # every event accepted once, in the provider's reversed order, and its duplicate recorded as one
    accepted_ids = list(
        WebhookDelivery.objects.filter(outcome="accepted").order_by("pk").values_list("event_id", flat=True)
    )
    assert accepted_ids == [e["id"] for e in reversed(events)]
    duplicates = Counter(WebhookDelivery.objects.filter(outcome="duplicate").values_list("event_id", flat=True))
    assert duplicates == Counter({e["id"]: 1 for e in events})
    assert WebhookDelivery.objects.filter(outcome="rejected").count() == 0
    assert RefundRequest.objects.filter(pk__in=[r.pk for r in requests], run__status="completed").count() == N
