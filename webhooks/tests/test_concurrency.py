"""Fifty deliveries of one event at the same instant, through a real daphne server: one is
accepted and starts one run, the other forty-nine are duplicates that did nothing. The same for
fifty copies of one GitHub-signed body, each under a delivery id of its own."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.support import AsgiServer, serving
from webhooks.models import WebhookDelivery
from webhooks.tests.support import SOURCES, encode, github_headers, standard_headers
from workflows.models import WorkflowRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

N = 50


@pytest.fixture(scope="module")
def server(django_db_setup: None, django_db_blocker: object) -> Iterator[AsgiServer]:
    with serving(django_db_blocker, WEBHOOK_SOURCES_JSON=json.dumps(SOURCES)) as process:
        yield process


Answer = tuple[int, dict[str, object]] | BaseException


def send_at_once(url: str, body: bytes, headers: list[dict[str, str]]) -> list[Answer]:
    """POST ``body`` with each of ``headers`` from a thread of its own, all released together."""
    barrier = threading.Barrier(len(headers))
    answers: list[Answer] = [ValueError("not sent")] * len(headers)

    def send(i: int) -> None:
        with httpx.Client(timeout=60) as client:
            barrier.wait()
            try:
                response = client.post(url, content=body, headers={**headers[i], "Content-Type": "application/json"})
                answers[i] = (response.status_code, response.json())
            except BaseException as exc:
                answers[i] = exc

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(headers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return answers


def assert_one_accepted(answers: list[Answer]) -> None:
    """Exactly one was accepted, and the others were told it is a duplicate."""
    statuses = sorted(a[0] if isinstance(a, tuple) else repr(a) for a in answers)
    assert statuses == [200] * (N - 1) + [202], statuses
    assert [a[1] for a in answers if isinstance(a, tuple) and a[0] == 200] == [{"status": "duplicate"}] * (N - 1)


def test_fifty_deliveries_of_one_event_at_once_are_accepted_once(server: AsgiServer) -> None:
    # given one signed event, and fifty senders released together
    body = encode({"type": "order.paid", "data": {"order": "1042"}})

    # when
    answers = send_at_once(f"{server.url}/webhooks/runs/", body, [standard_headers(body, "evt_race")] * N)

    # then exactly one was accepted, and the others were told it is a duplicate
    assert_one_accepted(answers)
    # and one effect: one run, named by the one accepted delivery
    [run] = WorkflowRun.objects.all()
    accepted = WebhookDelivery.objects.get(outcome="accepted")
    assert (accepted.event_id, accepted.run_id, run.idempotency_key) == ("evt_race", run.id, "runs:evt_race")
    assert WebhookDelivery.objects.filter(outcome="duplicate", run=None).count() == N - 1
    # and the duplicates, whose body was the accepted one's, kept no copy of it
    assert WebhookDelivery.objects.filter(outcome="duplicate", body__isnull=True).count() == N - 1
    assert WebhookDelivery.objects.count() == N


def test_fifty_copies_of_one_github_body_under_fifty_delivery_ids_are_accepted_once(server: AsgiServer) -> None:
    # given one body signed for a github source (its signature covers the body only), sent fifty
    # times at once, each under a delivery id of its own (a replay of a captured delivery)
    body = encode({"action": "opened", "number": 7})
    headers = [github_headers(body, f"guid-{i}") for i in range(N)]

    # when
    answers = send_at_once(f"{server.url}/webhooks/hub/", body, headers)

    # then one was accepted, and started one run; the others were duplicates that kept no body
    assert_one_accepted(answers)
    [run] = WorkflowRun.objects.all()
    accepted = WebhookDelivery.objects.get(outcome="accepted")
    assert (accepted.run_id, run.idempotency_key) == (run.id, f"hub:{accepted.event_id}")
    assert WebhookDelivery.objects.filter(outcome="duplicate", run=None, body__isnull=True).count() == N - 1
    assert WebhookDelivery.objects.count() == N
