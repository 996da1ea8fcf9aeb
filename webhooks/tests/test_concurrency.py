"""Fifty deliveries of one event at the same instant, through a real daphne server: one is
accepted and starts one run, the other forty-nine are duplicates that did nothing."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.support import AsgiServer
from webhooks.models import WebhookDelivery
from webhooks.tests.support import SOURCES, encode, standard_headers
from workflows.models import WorkflowRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

N = 50


@pytest.fixture(scope="module")
def server(django_db_setup: None, django_db_blocker: object) -> Iterator[AsgiServer]:
    process = AsgiServer(WEBHOOK_SOURCES_JSON=json.dumps(SOURCES))
    yield process
    with django_db_blocker.unblock():  # type: ignore[attr-defined]  # stop() waits for its connections
        process.stop()


def test_fifty_deliveries_of_one_event_at_once_are_accepted_once(server: AsgiServer) -> None:
    # given one signed event, and fifty senders released together
    body = encode({"type": "order.paid", "data": {"order": "1042"}})
    headers = {**standard_headers(body, "evt_race"), "Content-Type": "application/json"}
    barrier = threading.Barrier(N)
    answers: list[tuple[int, dict[str, object]] | BaseException] = [ValueError("not sent")] * N

    def send(i: int) -> None:
        with httpx.Client(timeout=60) as client:
            barrier.wait()
            try:
                response = client.post(f"{server.url}/webhooks/runs/", content=body, headers=headers)
                answers[i] = (response.status_code, response.json())
            except BaseException as exc:
                answers[i] = exc

    # when
    threads = [threading.Thread(target=send, args=(i,)) for i in range(N)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    # then exactly one was accepted, and the others were told it is a duplicate
    statuses = sorted(a[0] if isinstance(a, tuple) else repr(a) for a in answers)
    assert statuses == [200] * (N - 1) + [202], statuses
    assert [a[1] for a in answers if isinstance(a, tuple) and a[0] == 200] == [{"status": "duplicate"}] * (N - 1)
    # and one effect: one run, named by the one accepted delivery
    [run] = WorkflowRun.objects.all()
    accepted = WebhookDelivery.objects.get(outcome="accepted")
    assert (accepted.event_id, accepted.run_id, run.idempotency_key) == ("evt_race", run.id, "runs:evt_race")
    assert WebhookDelivery.objects.filter(outcome="duplicate", run=None).count() == N - 1
    # and the duplicates, whose body was the accepted one's, kept no copy of it
    assert WebhookDelivery.objects.filter(outcome="duplicate", body__isnull=True).count() == N - 1
    assert WebhookDelivery.objects.count() == N
