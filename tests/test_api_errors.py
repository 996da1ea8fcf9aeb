"""Every API of the project, fed what an attacker or a broken client sends: each answer is a 4xx
in the API's error shape, never a 500, and nothing is written.

The bodies are sent as bytes: a lone surrogate cannot be encoded as UTF-8, so it is sent the way a
client would, as the JSON escape ``\\ud800``."""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest, DecisionLog
from approvals.tests.support import GROUP, waiting_request
from examples.refunds.models import Order, RefundRequest
from examples.refunds.services import order_create
from examples.suppliers.models import REVIEWERS, SourceRecord, SupplierAssessment
from examples.suppliers.services import assessment_create
from workflows import services
from workflows.models import RunEvent, WorkflowRun
from workflows.storable import MAX_JSON_DEPTH

Users = dict[str, User]

NUL, SURROGATE = "a\x00b", "a\ud800b"


# --- helpers --------------------------------------------------------------------------------------
def caller(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def post_json(client: APIClient, url: str, body: Any, **headers: str) -> Any:
    """POST ``body`` as JSON with every non-ASCII character escaped (the only way to send a lone
    surrogate; DRF's test renderer would fail to encode it)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.generic("POST", url, data, content_type="application/json", headers=headers)  # type: ignore[arg-type]


def error_of(response: Any) -> dict[str, Any]:
    assert response["Content-Type"] == "application/json", (response.status_code, response.content[:300])
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "detail"}, body
    return dict(body["error"])


def written() -> tuple[int, ...]:
    """Every row a request to one of these APIs could write."""
    return tuple(model.objects.count() for model in (
        WorkflowRun, RunEvent, ApprovalRequest, DecisionLog, Order, RefundRequest, SupplierAssessment, SourceRecord))


@dataclass
class Endpoint:
    """A POST that takes a body: a valid body, its text fields and its JSON fields."""

    url: str
    body: dict[str, Any]
    text: list[str] = field(default_factory=list)
    json: list[str] = field(default_factory=list)
    user: str = "alice"


@pytest.fixture
def endpoints(users: Users) -> dict[str, Endpoint]:
    """One of each API that reads a body, with what it needs to exist and be visible to its caller."""
    alice = users["alice"]
    Group.objects.create(name=GROUP).user_set.add(users["carol"])
    Group.objects.create(name=REVIEWERS).user_set.add(users["bob"])
    run, _ = services.run_start(workflow="test.wait", payload={}, owner=alice)
    approval = waiting_request()
    order_create(number="5501", customer=alice, amount="50.00")
    assessment = assessment_create(supplier_name="Acme", requested_by=alice, sources={"credit": {"score": 7}})
    return {
        "run start": Endpoint("/api/workflows/test.echo/runs", {"payload": {"n": 1}}, json=["payload"]),
        "run event": Endpoint(f"/api/runs/{run.id}/events", {"type": "reply", "payload": {}, "idempotency_key": "k"},
                              text=["type", "idempotency_key"], json=["payload"]),
        "approval decision": Endpoint(f"/api/approvals/{approval.pk}/decision",
                                      {"approve": True, "version": "v1", "note": "ok"},
                                      text=["version", "note"], user="carol"),
        "refund": Endpoint("/api/orders/5501/refunds", {"amount": "10.00", "reason": "broken"},
                           text=["amount", "reason"]),
        "assessment": Endpoint("/api/assessments", {"supplier_name": "Globex", "sources": {"credit": {"score": 1}}},
                               text=["supplier_name"], json=["sources"]),
        "assessment source": Endpoint(f"/api/assessments/{assessment.pk}/sources",
                                      {"source": "credit", "content": {"score": 2}}, text=["source"], json=["content"]),
        "assessment submit": Endpoint(f"/api/assessments/{assessment.pk}/submit", {"input": {"scope": "tier 1"}},
                                      json=["input"]),
        "assessment review": Endpoint(f"/api/assessments/{assessment.pk}/review",
                                      {"approve": True, "report_version": 1, "note": "ok"}, text=["note"], user="bob"),
    }


ENDPOINTS = ["run start", "run event", "approval decision", "refund", "assessment", "assessment source",
             "assessment submit", "assessment review"]
Case = Callable[[Endpoint], list[tuple[str, Any]]]  # (what, body) pairs


# --- 11: deep nesting, NUL and lone surrogates ------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("name", ENDPOINTS)
@pytest.mark.parametrize("body", [
    pytest.param(b"[" * 100_000, id="100 KB of ["),
    pytest.param(b'{"x": ' + b"[" * 5_000 + b"]" * 5_000 + b"}", id="5,000 levels, well-formed"),
    # {"payload": {"x": [[...]]}} with the payload one level deeper than MAX_JSON_DEPTH
    pytest.param(b'{"x": {"x": ' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}}", id="one level too many"),
])
def test_json_nested_too_deep_is_a_parse_error(endpoints: dict[str, Endpoint], users: Users, name: str,
                                               body: bytes) -> None:
    endpoint = endpoints[name]
    before = written()

    response = post_json(caller(users[endpoint.user]), endpoint.url, body)

    assert response.status_code == 400, response.content[:300]
    error = error_of(response)
    assert error["code"] == "parse_error"
    assert "nested more than" in error["message"]
    assert written() == before


@pytest.mark.django_db
def test_json_at_the_depth_limit_is_accepted(users: Users) -> None:
    nested: Any = "deep"
    for _ in range(MAX_JSON_DEPTH - 1):  # plus the payload object itself: exactly the limit
        nested = [nested]

    response = post_json(caller(users["alice"]), "/api/workflows/test.echo/runs", {"payload": {"x": nested}})

    assert response.status_code == 201, response.content[:300]
    assert WorkflowRun.objects.get().payload == {"x": nested}


@pytest.mark.django_db
@pytest.mark.parametrize("name", ENDPOINTS)
@pytest.mark.parametrize("bad", [NUL, SURROGATE], ids=["NUL", "lone surrogate"])
def test_text_postgresql_cannot_store_is_a_400_naming_the_field(endpoints: dict[str, Endpoint], users: Users,
                                                               name: str, bad: str) -> None:
    endpoint = endpoints[name]
    client = caller(users[endpoint.user])
    before = written()
    for text_field in endpoint.text:
        response = post_json(client, endpoint.url, {**endpoint.body, text_field: bad})

        assert response.status_code == 400, (text_field, response.content[:300])
        error = error_of(response)
        assert error["code"] == "invalid" and text_field in error["detail"], error
    assert written() == before


@pytest.mark.django_db
@pytest.mark.parametrize("name", ENDPOINTS)
@pytest.mark.parametrize("bad", [NUL, SURROGATE], ids=["NUL", "lone surrogate"])
def test_json_postgresql_cannot_store_is_a_400_anywhere_in_it(endpoints: dict[str, Endpoint], users: Users,
                                                             name: str, bad: str) -> None:
    endpoint = endpoints[name]
    client = caller(users[endpoint.user])
    before = written()
    for json_field in endpoint.json:
        for where, value in [("a value", {"note": bad}), ("a key", {bad: 1}), ("deep inside", {"a": [{"b": [bad]}]})]:
            response = post_json(client, endpoint.url, {**endpoint.body, json_field: value})

            assert response.status_code == 400, (json_field, where, response.content[:300])
            error = error_of(response)
            assert error["code"] == "invalid_payload", (json_field, where, error)
            assert ("NUL" if bad == NUL else "unpaired surrogate") in error["message"], error
    assert written() == before


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["run start", "refund"])
@pytest.mark.parametrize("bad", [NUL, SURROGATE], ids=["NUL", "lone surrogate"])
def test_an_idempotency_key_postgresql_cannot_store_is_a_400(endpoints: dict[str, Endpoint], users: Users,
                                                            name: str, bad: str) -> None:
    endpoint = endpoints[name]
    before = written()

    response = post_json(caller(users[endpoint.user]), endpoint.url, endpoint.body, **{"Idempotency-Key": bad})

    assert response.status_code == 400, response.content[:300]
    assert "Idempotency-Key" in error_of(response)["detail"]
    assert written() == before


def test_services_refuse_what_postgresql_cannot_store_whoever_calls_them(db: None) -> None:
    """The same checks without HTTP: a payload from manage.py or another service."""
    from workflows.exceptions import InvalidPayload

    deep: Any = 1
    for _ in range(5_000):
        deep = [deep]
    for payload, message in [({"a": SURROGATE}, "unpaired surrogate (\\ud800)"), ({SURROGATE: 1}, "unpaired surrogate"),
                             ({"a": [NUL]}, "NUL character"), ({"a": deep}, "nested more than"),
                             ({"a": "\U0001f600 é \\ud800"}, None)]:  # an emoji's pair, text that looks like one
        if message is None:
            services.check_payload(payload)
            continue
        with pytest.raises(InvalidPayload, match=re.escape(message)):
            services.run_start(workflow="test.echo", payload=payload)
    assert WorkflowRun.objects.count() == 0
