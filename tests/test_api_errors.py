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
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest, DecisionLog
from approvals.tests.support import GROUP, waiting_request
from examples.refunds.models import Order, RefundRequest
from examples.refunds.services import order_create
from examples.suppliers.models import REVIEWERS, SourceRecord, SupplierAssessment
from examples.suppliers.services import assessment_create
from tests.factories import Users, api_login
from workflows import services
from workflows.models import RunEvent, WorkflowRun
from workflows.storable import MAX_JSON_DEPTH

NUL, SURROGATE = "a\x00b", "a\ud800b"


# --- helpers --------------------------------------------------------------------------------------
def post_json(client: APIClient, url: str, body: Any, **headers: str) -> Any:
    """POST ``body`` as JSON with every non-ASCII character escaped (the only way to send a lone
    surrogate; DRF's test renderer would fail to encode it)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    # bytes, not str: some bodies are deliberately not UTF-8 (the stubs say str; DRF takes both)
    return client.generic("POST", url, data, content_type="application/json", headers=headers)  # type: ignore[arg-type]


def error_of(response: Any) -> dict[str, Any]:
    assert response["Content-Type"] == "application/json", (response.status_code, response.content[:300])
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "detail"}, body
    return dict(body["error"])


def written() -> tuple[int, ...]:
    """Every row a request to one of these APIs could write."""
    return tuple(
        model.objects.count()
        for model in (
            WorkflowRun,
            RunEvent,
            ApprovalRequest,
            DecisionLog,
            Order,
            RefundRequest,
            SupplierAssessment,
            SourceRecord,
        )
    )


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
    alice = users.alice
    Group.objects.create(name=GROUP).user_set.add(users.carol)
    Group.objects.create(name=REVIEWERS).user_set.add(users.bob)
    run, _ = services.run_start(workflow="test.wait", payload={}, owner=alice)
    approval = waiting_request()
    order_create(number="5501", customer=alice, amount="50.00")
    assessment = assessment_create(supplier_name="Acme", requested_by=alice, sources={"credit": {"score": 7}})
    return {
        "run start": Endpoint("/api/workflows/test.echo/runs", {"payload": {"n": 1}}, json=["payload"]),
        "run event": Endpoint(
            f"/api/runs/{run.id}/events",
            {"type": "reply", "payload": {}, "idempotency_key": "k"},
            text=["type", "idempotency_key"],
            json=["payload"],
        ),
        "approval decision": Endpoint(
            f"/api/approvals/{approval.pk}/decision",
            {"approve": True, "version": "v1", "note": "ok"},
            text=["version", "note"],
            user="carol",
        ),
        "refund": Endpoint(
            "/api/orders/5501/refunds", {"amount": "10.00", "reason": "broken"}, text=["amount", "reason"]
        ),
        "assessment": Endpoint(
            "/api/assessments",
            {"supplier_name": "Globex", "sources": {"credit": {"score": 1}}},
            text=["supplier_name"],
            json=["sources"],
        ),
        "assessment source": Endpoint(
            f"/api/assessments/{assessment.pk}/sources",
            {"source": "credit", "content": {"score": 2}},
            text=["source"],
            json=["content"],
        ),
        "assessment submit": Endpoint(
            f"/api/assessments/{assessment.pk}/submit", {"input": {"scope": "tier 1"}}, json=["input"]
        ),
        "assessment review": Endpoint(
            f"/api/assessments/{assessment.pk}/review",
            {"approve": True, "report_version": 1, "note": "ok"},
            text=["note"],
            user="bob",
        ),
    }


ENDPOINTS = [
    "run start",
    "run event",
    "approval decision",
    "refund",
    "assessment",
    "assessment source",
    "assessment submit",
    "assessment review",
]
Case = Callable[[Endpoint], list[tuple[str, Any]]]  # (what, body) pairs


# --- 11: deep nesting, NUL and lone surrogates ------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("name", ENDPOINTS)
@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"[" * 100_000, id="100 KB of ["),
        pytest.param(b'{"x": ' + b"[" * 5_000 + b"]" * 5_000 + b"}", id="5,000 levels, well-formed"),
        # {"payload": {"x": [[...]]}} with the payload one level deeper than MAX_JSON_DEPTH
        pytest.param(b'{"x": {"x": ' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}}", id="one level too many"),
    ],
)
def test_json_nested_too_deep_is_a_parse_error(
    endpoints: dict[str, Endpoint], users: Users, name: str, body: bytes
) -> None:
    endpoint = endpoints[name]
    before = written()

    response = post_json(api_login(getattr(users, endpoint.user), via="force"), endpoint.url, body)

    assert response.status_code == 400, response.content[:300]
    error = error_of(response)
    assert error["code"] == "parse_error"
    assert "nested more than" in error["message"]
    assert written() == before


@pytest.mark.django_db
@pytest.mark.parametrize("name", [*ENDPOINTS, "submission"])
@pytest.mark.parametrize("number", [b"1e400", b"-1E400", b"9" * 5000])
def test_a_number_too_large_for_a_float_is_a_parse_error(
    endpoints: dict[str, Endpoint], users: Users, name: str, number: bytes
) -> None:
    # Python reads it as infinity, which is not JSON: every endpoint refuses it the same way
    url, user = (
        ("/api/agents/test.chat/t/submissions", "alice")
        if name == "submission"
        else (endpoints[name].url, endpoints[name].user)
    )
    before = written()

    response = post_json(api_login(getattr(users, user), via="force"), url, b'{"metadata": {"x": ' + number + b"}}")

    assert response.status_code == 400, response.content[:300]
    assert error_of(response)["code"] == "parse_error"
    assert "too large a number" in error_of(response)["message"]
    assert "sys." not in error_of(response)["message"]
    assert written() == before


@pytest.mark.django_db
@pytest.mark.parametrize("charset", ["bz2_codec", "base64_codec", "rot13"])
def test_a_charset_that_is_no_text_encoding_is_a_parse_error(users: Users, charset: str) -> None:
    # Django takes any charset Python's codecs know; these decode bytes to bytes, or text to text
    response = api_login(users.alice, via="force").generic(
        "POST",
        "/api/workflows/test.echo/runs",
        b'{"payload": {}}',  # type: ignore[arg-type]  # bytes, as post_json sends them
        content_type=f"application/json; charset={charset}",
    )

    assert response.status_code == 400, response.content[:300]
    assert error_of(response)["code"] == "parse_error"
    assert not WorkflowRun.objects.exists()


@pytest.mark.django_db
def test_json_at_the_depth_limit_is_accepted(users: Users) -> None:
    nested: Any = "deep"
    for _ in range(MAX_JSON_DEPTH - 1):  # plus the payload object itself: exactly the limit
        nested = [nested]

    response = post_json(
        api_login(users.alice, via="force"), "/api/workflows/test.echo/runs", {"payload": {"x": nested}}
    )

    assert response.status_code == 201, response.content[:300]
    assert WorkflowRun.objects.get().payload == {"x": nested}


@pytest.mark.django_db
@pytest.mark.parametrize("name", ENDPOINTS)
@pytest.mark.parametrize("bad", [NUL, SURROGATE], ids=["NUL", "lone surrogate"])
def test_text_postgresql_cannot_store_is_a_400_naming_the_field(
    endpoints: dict[str, Endpoint], users: Users, name: str, bad: str
) -> None:
    endpoint = endpoints[name]
    client = api_login(getattr(users, endpoint.user), via="force")
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
def test_json_postgresql_cannot_store_is_a_400_anywhere_in_it(
    endpoints: dict[str, Endpoint], users: Users, name: str, bad: str
) -> None:
    endpoint = endpoints[name]
    client = api_login(getattr(users, endpoint.user), via="force")
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
def test_an_idempotency_key_postgresql_cannot_store_is_a_400(
    endpoints: dict[str, Endpoint], users: Users, name: str, bad: str
) -> None:
    endpoint = endpoints[name]
    before = written()

    response = post_json(
        api_login(getattr(users, endpoint.user), via="force"), endpoint.url, endpoint.body, **{"Idempotency-Key": bad}
    )

    assert response.status_code == 400, response.content[:300]
    assert "Idempotency-Key" in error_of(response)["detail"]
    assert written() == before


def test_services_refuse_what_postgresql_cannot_store_whoever_calls_them(db: None) -> None:
    """The same checks without HTTP: a payload from manage.py or another service."""
    from workflows.exceptions import InvalidPayload

    deep: Any = 1
    for _ in range(5_000):
        deep = [deep]
    cases: list[tuple[dict[str, Any], str | None]] = [
        ({"a": SURROGATE}, "unpaired surrogate (\\ud800)"),
        ({SURROGATE: 1}, "unpaired surrogate"),
        ({"a": [NUL]}, "NUL character"),
        ({"a": deep}, "nested more than"),
        ({"a": "\U0001f600 é \\ud800"}, None),  # an emoji's pair, text that looks like one
    ]
    for payload, message in cases:
        if message is None:
            services.check_payload(payload)
            continue
        with pytest.raises(InvalidPayload, match=re.escape(message)):
            services.run_start(workflow="test.echo", payload=payload)
    assert WorkflowRun.objects.count() == 0


# --- 12: ids, unknown paths, unbounded integers ----------------------------------------------------
BAD_IDS = ["\u00b2", "9" * 3_000, "1" * 19, "-1", "1.0", "0x1", "%00"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/approvals/{id}"),
        ("POST", "/api/approvals/{id}/decision"),
        ("GET", "/api/refunds/{id}"),
        ("GET", "/api/assessments/{id}"),
        ("POST", "/api/assessments/{id}/sources"),
        ("POST", "/api/assessments/{id}/submit"),
        ("POST", "/api/assessments/{id}/review"),
        ("GET", "/api/runs/{id}"),
        ("POST", "/api/runs/{id}/events"),
        ("POST", "/api/runs/{id}/pause"),
    ],
)
def test_a_malformed_id_is_the_apis_json_404(users: Users, method: str, path: str) -> None:
    client = api_login(users.carol, via="force")
    before = written()
    for bad in BAD_IDS:
        response = client.generic(method, path.format(id=bad), "{}", content_type="application/json")

        assert response.status_code == 404, (bad, response.status_code, response.content[:300])
        assert error_of(response)["code"] == "not_found"
    assert written() == before


@pytest.mark.django_db
@pytest.mark.parametrize("number", ["%00", "12%0A34", "1" * 201])
def test_an_order_number_with_a_control_character_or_too_long_is_the_json_404(users: Users, number: str) -> None:
    order_create(number="1234", customer=users.alice, amount="50.00")
    before = written()

    response = post_json(api_login(users.alice, via="force"), f"/api/orders/{number}/refunds", {"amount": "1.00"})

    assert response.status_code == 404, response.content[:300]
    assert error_of(response)["code"] == "not_found"
    assert written() == before


@pytest.mark.django_db
def test_the_largest_id_the_routes_take_is_looked_up(users: Users) -> None:
    for path in ["/api/approvals/", "/api/refunds/", "/api/assessments/"]:
        response = api_login(users.alice, via="force").get(path + "9" * 18)
        assert response.status_code == 404 and error_of(response)["code"] == "not_found"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        "/api/nope",
        "/api/",
        "/api/runs/",
        "/api/runs/x/y/z",
        "/api/approvals/1/nope",
        "/api/workflows/test.echo/runs/extra",
    ],
)
@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"])
@pytest.mark.parametrize("who", ["alice", None])
def test_an_unknown_api_path_is_the_json_404_whatever_the_method_and_whoever_asks(
    users: Users, path: str, method: str, who: str | None
) -> None:
    client = api_login(getattr(users, who) if who else None, via="force")

    response = client.generic(method, path, "{}", content_type="application/json")

    assert response.status_code == 404, response.content[:300]
    assert response["Content-Type"] == "application/json"
    if method != "HEAD":
        assert error_of(response)["code"] == "not_found"


@pytest.mark.django_db
def test_pages_outside_the_api_keep_djangos_404(users: Users) -> None:
    response = api_login(users.alice, via="force").get("/no-such-page/")

    assert response.status_code == 404
    assert not response["Content-Type"].startswith("application/json")


@pytest.mark.django_db
def test_the_schema_states_the_ids_the_routes_take_and_leaves_out_the_catch_all() -> None:
    from drf_spectacular.generators import SchemaGenerator

    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]

    assert "/api/" not in paths and not [path for path in paths if "^" in path or "(" in path]
    ids = {"type": "integer", "minimum": 0, "maximum": 10**18 - 1}
    for path, method, name in [
        ("/api/approvals/{request_id}", "get", "request_id"),
        ("/api/refunds/{refund_id}", "get", "refund_id"),
        ("/api/assessments/{assessment_id}/review", "post", "assessment_id"),
    ]:
        [parameter] = [p for p in paths[path][method]["parameters"] if p["name"] == name]
        assert (parameter["in"], parameter["schema"]) == ("path", ids), path


@pytest.mark.django_db
@pytest.mark.parametrize("version", [2**31, 10**30, 10**300])
def test_a_report_version_beyond_any_report_is_a_400(users: Users, version: int) -> None:
    # given an assessment whose report v1 waits for bob's review
    Group.objects.create(name=REVIEWERS).user_set.add(users.bob)
    assessment = assessment_create(supplier_name="Acme", requested_by=users.alice, sources={"credit": {"s": 1}})
    review = waiting_request(
        subject_type="suppliers.supplierassessment",
        subject_id=str(assessment.pk),
        version="report-v1",
        approvers=REVIEWERS,
    )
    before = written()

    # when bob sends a version no report can have
    response = post_json(
        api_login(users.bob, via="force"),
        f"/api/assessments/{assessment.pk}/review",
        {"approve": True, "report_version": version},
    )

    # then it is refused as invalid input, the review still pending and nothing logged
    assert response.status_code == 400, response.content[:300]
    error = error_of(response)
    assert error["code"] == "invalid" and "report_version" in error["detail"]
    assert written() == before
    assert ApprovalRequest.objects.get(pk=review.pk).status == "pending"


# --- 13: a service's PermissionDenied ---------------------------------------------------------------
@pytest.mark.django_db
def test_a_services_permission_denied_is_a_403_permission_denied_with_its_reason(users: Users) -> None:
    # given alice's assessment, and bob, a reviewer, who may see it but not submit its input
    Group.objects.create(name=REVIEWERS).user_set.add(users.bob)
    assessment = assessment_create(supplier_name="Acme", requested_by=users.alice, sources={"credit": {"s": 1}})
    before = written()

    # when bob submits the input (the service raises django.core.exceptions.PermissionDenied)
    response = post_json(api_login(users.bob, via="force"), f"/api/assessments/{assessment.pk}/submit", {"input": {}})

    # then the refusal has the API's code for it and the service's reason, and nothing started
    assert response.status_code == 403
    error = error_of(response)
    assert error["code"] == "permission_denied", error
    assert error["message"].startswith("bob may not") and f"assessment {assessment.pk}" in error["message"], error
    assert written() == before


def test_a_permission_denied_without_a_reason_gets_drfs_message() -> None:
    from django.core.exceptions import PermissionDenied

    from workflows.apis.errors import exception_handler

    response = exception_handler(PermissionDenied(), {})

    assert response is not None and response.status_code == 403
    assert response.data == {
        "error": {
            "code": "permission_denied",
            "detail": None,
            "message": "You do not have permission to perform this action.",
        }
    }
