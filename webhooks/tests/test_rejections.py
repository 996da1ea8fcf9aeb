"""What anyone can make us store: deliveries rejected before their signature held are recorded up to
a limit per source and address, and per source (``webhooks.rejections``, real Redis); past it they
are answered the same, counted, and not stored. Deliveries whose signature held are always recorded."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from django.test import Client
from prometheus_client import REGISTRY

from webhooks.models import WebhookDelivery
from webhooks.tests.support import SOURCES, encode, standard_headers

pytestmark = pytest.mark.django_db

EVENT = encode({"type": "order.paid", "data": {"order": "1042"}})


@pytest.fixture(autouse=True)
def small_limits(settings: Any) -> None:
    settings.WEBHOOK_SOURCES = SOURCES
    settings.WEBHOOKS_MAX_REJECTIONS_RECORDED_PER_ADDRESS = 3
    settings.WEBHOOKS_MAX_REJECTIONS_RECORDED_PER_SOURCE = 5
    settings.WEBHOOKS_REJECTIONS_WINDOW_SECONDS = 600


def post(headers: dict[str, str], *, address: str = "198.51.100.7", body: bytes = EVENT) -> Any:
    return Client(REMOTE_ADDR=address).post(
        "/webhooks/runs/", data=body, content_type="application/json", headers=headers
    )


def forged(event_id: str = "evt_real", **kwargs: Any) -> Any:
    return post(standard_headers(EVENT, event_id, secret="whsec_" + "Zm9yZ2Vk"), **kwargs)


def unrecorded() -> float:
    return REGISTRY.get_sample_value("webhooks_rejections_unrecorded_total", {"source": "runs"}) or 0.0


def test_an_address_past_its_limit_is_answered_the_same_but_not_recorded(caplog: pytest.LogCaptureFixture) -> None:
    before = unrecorded()

    answers = [forged() for _ in range(6)]

    # every forgery gets its 401, with what was wrong
    assert [a.status_code for a in answers] == [401] * 6
    assert {a.json()["error"]["code"] for a in answers} == {"bad_signature"}
    # the first three are recorded, the rest not; no answer tells which (nor names a record)
    rows = list(WebhookDelivery.objects.order_by("id").values_list("outcome", "reason"))
    assert rows == [("rejected", "bad_signature")] * 3
    assert {json.dumps(a.json(), sort_keys=True) for a in answers} == {json.dumps(answers[0].json(), sort_keys=True)}
    assert answers[0].json()["error"]["detail"] == {"delivery": None}
    assert unrecorded() - before == 3
    # the log says so once, not once a request
    said = [r for r in caplog.records if getattr(r, "event", "") == "delivery.rejections_unrecorded"]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "more than 3 rejections from 198.51.100.7" in said[0].getMessage()
    # and only the webhooks logger speaks of them: one line for each recorded, none for the rest
    assert not [r for r in caplog.records if r.name == "django.request"]
    assert len([r for r in caplog.records if getattr(r, "event", "") == "delivery.rejected"]) == 3


def test_what_the_signature_vouches_for_is_recorded_whatever_the_counts() -> None:
    for _ in range(4):
        forged()
    assert WebhookDelivery.objects.count() == 3

    # a signed delivery from the same address is accepted and recorded, its replay too
    assert post(standard_headers(EVENT, "evt_1")).status_code == 202
    assert post(standard_headers(EVENT, "evt_1")).status_code == 200
    # a signed body that is not JSON: rejected after the signature held, so from someone with the
    # secret, and recorded
    assert post(standard_headers(b"{not json", "evt_2"), body=b"{not json").status_code == 400

    assert sorted(WebhookDelivery.objects.values_list("outcome", "reason")) == [
        ("accepted", ""),
        ("duplicate", ""),
        ("rejected", "bad_signature"),
        ("rejected", "bad_signature"),
        ("rejected", "bad_signature"),
        ("rejected", "parse_error"),
    ]


def test_the_source_has_a_limit_of_its_own_which_an_address_past_its_own_does_not_use_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # one address past its own limit: 3 recorded, and its 7 more do not count for the source
    for _ in range(10):
        forged(address="203.0.113.1")
    assert WebhookDelivery.objects.count() == 3

    # others are recorded until the source's limit (5 in all), then not, whoever sends
    for n in range(4):
        forged(address=f"203.0.113.{10 + n}")
    assert WebhookDelivery.objects.count() == 5

    # an oversized body (413, refused before it is read) counts as a forgery does
    big = b"x" * (SOURCES["runs"]["max_body_bytes"] + 1)
    answer = post(standard_headers(big, "evt_big"), address="203.0.113.99", body=big)
    assert answer.status_code == 413 and answer.json()["error"]["detail"] == {"delivery": None}
    assert WebhookDelivery.objects.count() == 5

    # once the source's limit is reached, addresses past their own are not said one by one: the
    # lines would grow with the addresses a forger has
    for n in range(20):
        for _ in range(4):
            forged(address=f"2001:db8:{n}::1")
    said = [r.getMessage() for r in caplog.records if getattr(r, "event", "") == "delivery.rejections_unrecorded"]
    assert [line.split(" in 600 s;")[0] for line in said] == [
        "webhook runs: more than 3 rejections from 203.0.113.1",
        "webhook runs: more than 5 rejections from all addresses",
    ]
    assert WebhookDelivery.objects.count() == 5


def test_a_limit_of_0_records_every_rejection(settings: Any) -> None:
    settings.WEBHOOKS_MAX_REJECTIONS_RECORDED_PER_ADDRESS = 0
    settings.WEBHOOKS_MAX_REJECTIONS_RECORDED_PER_SOURCE = 0

    for _ in range(8):
        assert forged().status_code == 401

    assert WebhookDelivery.objects.count() == 8


def test_without_redis_every_rejection_is_recorded(
    settings: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from accounts import addresses

    monkeypatch.setattr(addresses, "_limits", None)
    monkeypatch.setattr(addresses, "_said", {})
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there

    for _ in range(5):
        assert forged().status_code == 401

    assert WebhookDelivery.objects.count() == 5
    # the log says so once, without a traceback: each forgery adds no more than its own line
    [said] = [r for r in caplog.records if getattr(r, "event", "") == "limits.redis_down"]
    assert said.exc_info is None and "all are recorded" in said.getMessage()


def test_a_content_length_of_other_digits_is_left_to_the_body_read() -> None:
    from webhooks.conf import source_get
    from webhooks.services import check_size

    source = source_get("runs")
    assert source is not None
    # "²" and "٣" are digits to str.isdigit(), not to int(): no ValueError, the body's own size decides
    for declared in ("\u00b2", "\u0663", "+5000", "-1", ""):
        check_size(source=source, content_length=declared)
