"""The admin lists deliveries read-only, filtered by source and outcome, found by event id, with the
configured sources above the list and no secret anywhere on the page."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from tests.factories import Users, login
from webhooks.models import WebhookDelivery
from webhooks.tests.support import ROTATED, SECRET, SOURCES, encode, github_headers, standard_headers

pytestmark = pytest.mark.django_db
URL = "/admin/webhooks/webhookdelivery/"


@pytest.fixture
def viewer(users: Users, settings: Any) -> User:
    """Carol, staff who may view deliveries."""
    settings.WEBHOOK_SOURCES = SOURCES
    carol = users.carol
    carol.is_staff = True
    carol.save()
    carol.user_permissions.add(Permission.objects.get(codename="view_webhookdelivery"))
    return User.objects.get(pk=carol.pk)


def deliver(event_id: str, *, signed: bool = True) -> None:
    body = encode({"data": {"order": event_id}})
    headers = standard_headers(body, event_id) if signed else {}
    Client().post("/webhooks/runs/", data=body, content_type="application/json", headers=headers)


def test_the_list_shows_the_sources_without_their_secrets(viewer: User) -> None:
    deliver("evt_a")

    page = login(viewer).get(URL)

    assert page.status_code == 200
    text = page.content.decode()
    assert 'id="webhook-sources"' in text and "/webhooks/runs/" in text
    assert "start workflow &#x27;test.echo&#x27;" in text
    assert "evt_a" in text
    for secret in (SECRET, ROTATED, SECRET.removeprefix("whsec_")):
        assert secret not in text


def test_filter_by_source_and_outcome_and_search_by_event_id(viewer: User) -> None:
    deliver("evt_a")
    deliver("evt_b", signed=False)
    client = login(viewer)

    rejected = client.get(URL, {"outcome": "rejected"}).content.decode()
    found = client.get(URL, {"q": "evt_a"}).content.decode()
    other_source = client.get(URL, {"source": "hub"}).content.decode()

    assert "missing_header" in rejected and "evt_a" not in rejected
    assert "evt_a" in found
    assert "evt_a" not in other_source


def test_an_event_id_nobody_vouched_for_says_so(viewer: User) -> None:
    # a delivery of evt_a, and a forgery under its id (a wrong secret)
    deliver("evt_a")
    body = encode({"data": {"order": "evt_a"}})
    forged = standard_headers(body, "evt_a", secret="whsec_Zm9yZ2VkLXNlY3JldA==")
    Client().post("/webhooks/runs/", data=body, content_type="application/json", headers=forged)
    accepted, rejected = WebhookDelivery.objects.order_by("id")
    client = login(viewer)

    # a search for the id finds both; only the forgery's is marked
    found = client.get(URL, {"q": "evt_a"}).content.decode()
    assert found.count("evt_a (claimed, unverified)") == 1 and found.count('class="field-event_id_shown"') == 2
    assert "evt_a (claimed, unverified)" in client.get(f"{URL}{rejected.pk}/change/").content.decode()
    assert "(claimed, unverified)" not in client.get(f"{URL}{accepted.pk}/change/").content.decode()


def test_a_github_delivery_id_is_shown_as_not_signed(viewer: User) -> None:
    body = encode({"action": "opened"})
    Client().post("/webhooks/hub/", data=body, content_type="application/json", headers=github_headers(body, "gh-1"))
    delivery = WebhookDelivery.objects.get(outcome="accepted")

    page = login(viewer).get(f"{URL}{delivery.pk}/change/").content.decode()

    assert "gh-1 (not covered by the signature)" in page


def test_a_delivery_page_is_read_only_and_shows_what_it_did(viewer: User) -> None:
    deliver("evt_a")
    delivery = WebhookDelivery.objects.get()
    client = login(viewer)

    page = client.get(f"{URL}{delivery.pk}/change/")

    assert page.status_code == 200
    assert "[redacted]" in page.content.decode()  # the signature header
    assert client.post(f"{URL}{delivery.pk}/change/", {"source": "x"}).status_code == 403
    assert client.get(f"{URL}add/").status_code == 403
    assert client.post(f"{URL}{delivery.pk}/delete/", {"post": "yes"}).status_code == 403
    assert WebhookDelivery.objects.get().source == "runs"
