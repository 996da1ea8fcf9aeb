"""A source whose events become submissions to an agent: the event's text is queued as a user
message, once per event id, and a full queue or a missing account is an answer the sender retries."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from accounts.models import Account
from agents.models import Agent, Submission, SubmissionStatus, Turn
from agents.submissions import submission_cancel
from webhooks.actions import Event, event_key
from webhooks.models import WebhookDelivery
from webhooks.tests.support import SECRET, encode, standard_headers

pytestmark = pytest.mark.django_db

ACTION = {"type": "submission", "account": "acme", "kind": "test.chat", "name": "crm-inbox", "text_from": "data.text"}


@pytest.fixture(autouse=True)
def crm(settings: Any) -> Iterator[Account]:
    settings.WEBHOOK_SOURCES = {"crm": {"scheme": "standard", "secrets": [SECRET], "action": ACTION}}
    yield Account.objects.create(slug="acme", name="Acme")


def deliver(event_id: str, body: Any) -> Any:
    raw = encode(body)
    return Client().post(
        "/webhooks/crm/", data=raw, content_type="application/json", headers=standard_headers(raw, event_id)
    )


def ticket(text: str) -> dict[str, Any]:
    return {"type": "ticket.created", "data": {"text": text, "ticket": 77}}


def test_an_event_becomes_one_submission_to_the_agent() -> None:
    response = deliver("evt_1", ticket("Order 1042 arrived damaged"))

    assert response.status_code == 202, response.content
    [submission] = Submission.objects.all()
    assert submission.agent.account.slug == "acme"
    assert (submission.agent.kind, submission.agent.name) == ("test.chat", "crm-inbox")
    assert submission.messages == [{"role": "user", "content": "Order 1042 arrived damaged"}]
    assert submission.metadata == {"webhook": "crm", "event_id": "evt_1", "type": "ticket.created"}
    assert submission.idempotency_key == "crm:evt_1" and submission.submitted_by is None
    assert submission.turn is not None and submission.turn.source == "submission"
    delivery = WebhookDelivery.objects.get(outcome="accepted")
    assert delivery.submission == submission
    assert delivery.result == {"submission": str(submission.pk), "agent": str(submission.agent), "created": True}


def test_a_replayed_event_submits_nothing_more() -> None:
    assert deliver("evt_1", ticket("hello")).status_code == 202

    again = deliver("evt_1", ticket("hello"))

    assert (again.status_code, again.json()) == (200, {"status": "duplicate"})
    assert Submission.objects.count() == 1 and Turn.objects.count() == 1
    assert sorted(WebhookDelivery.objects.values_list("outcome", flat=True)) == ["accepted", "duplicate"]


def test_events_queue_in_order_behind_the_running_one() -> None:
    for n in range(3):
        assert deliver(f"evt_{n}", ticket(f"message {n}")).status_code == 202

    submissions = Submission.objects.order_by("turn__number")
    assert [s.messages[0]["content"] for s in submissions] == ["message 0", "message 1", "message 2"]
    assert [s.status for s in submissions] == ["running", "pending", "pending"]


def test_an_event_without_the_text_is_a_400_that_opens_no_agent() -> None:
    response = deliver("evt_1", {"type": "ticket.created", "data": {"ticket": 77}})

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_event"
    assert not Agent.objects.exists() and not Submission.objects.exists()
    [delivery] = WebhookDelivery.objects.all()
    assert (delivery.outcome, delivery.reason, delivery.event_id) == ("rejected", "invalid_event", "evt_1")


@pytest.mark.parametrize("text", ["", "   ", "x" * 100_001])
def test_text_a_message_cannot_be_is_a_400(text: str, settings: Any) -> None:
    settings.AGENTS_MAX_MESSAGE_CHARS = 100_000

    response = deliver("evt_1", ticket(text))

    assert response.status_code == 400, response.content
    assert not Agent.objects.exists() and not Submission.objects.exists()


def test_a_full_queue_is_a_429_and_the_retry_is_accepted_once_there_is_room(settings: Any) -> None:
    settings.AGENTS_MAX_PENDING_SUBMISSIONS = 1
    assert deliver("evt_1", ticket("first")).status_code == 202  # running
    assert deliver("evt_2", ticket("second")).status_code == 202  # pending: the queue is full

    full = deliver("evt_3", ticket("third"))

    assert full.status_code == 429
    assert full.json()["error"]["code"] == "too_many_pending"
    assert Submission.objects.count() == 2
    assert WebhookDelivery.objects.get(event_id="evt_3").outcome == "rejected"
    pending = Submission.objects.get(status=SubmissionStatus.PENDING)
    submission_cancel(submission=pending, user=None)  # its turn is cancelled with it: room for one

    retried = deliver("evt_3", ticket("third"))

    assert retried.status_code == 202
    assert Submission.objects.filter(idempotency_key="crm:evt_3").count() == 1


def test_an_account_that_does_not_exist_is_a_503_the_sender_retries(crm: Account) -> None:
    crm.delete()

    response = deliver("evt_1", ticket("hello"))

    assert response.status_code == 503
    assert response.json()["error"] == {
        "code": "agent_unavailable",
        "message": "no account 'acme'",
        "detail": {"delivery": WebhookDelivery.objects.get().pk},
    }
    assert not Agent.objects.exists()


def test_a_key_that_would_not_fit_is_hashed() -> None:
    short, long = Event("crm", "e" * 200, {}), Event("s" * 100, "e" * 200, {})

    assert event_key(short) == "crm:" + "e" * 200
    assert event_key(long).startswith("s" * 100 + ":sha256:") and len(event_key(long)) <= 255
    assert event_key(long) != event_key(Event("s" * 100, "e" * 199 + "f", {}))
