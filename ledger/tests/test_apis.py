"""GET /api/operations: who may list, filters, cursor pages, redaction, JSON errors."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import include, path
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema

from ledger.models import OperationStatus
from ledger.tests.support import make_operation
from tests.factories import Users, api_login

pytestmark = pytest.mark.django_db

URL = "/api/operations"


def error_of(response: Any) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "detail"}, body
    return dict(body["error"])


def keys(response: Any) -> list[str]:
    assert response.status_code == 200, response.content
    return [op["key"] for op in response.json()["results"]]


@pytest.fixture
def carol(users: Users) -> User:
    """Staff with the view permission on operations."""
    carol = users.carol
    carol.user_permissions.add(Permission.objects.get(codename="view_externaloperation"))
    return User.objects.get(pk=carol.pk)


def test_only_staff_with_the_view_permission_may_list(users: Users, carol: User) -> None:
    # given
    make_operation("refund:1")

    # when
    anonymous = api_login(None).get(URL)
    as_alice = api_login(users.alice).get(URL)
    as_mallory = api_login(users.mallory).get(URL + "?status=unknown")
    as_dave = api_login(users.dave).get(URL)  # staff who may view runs and approvals, not operations
    as_carol = api_login(carol).get(URL)

    # then
    assert anonymous.status_code == 401 and error_of(anonymous)["code"] == "not_authenticated"
    for refused in (as_alice, as_mallory, as_dave):
        assert refused.status_code == 403
        assert error_of(refused)["code"] == "permission_denied"
        assert "refund:1" not in refused.content.decode()
    assert keys(as_carol) == ["refund:1"]


def test_filters_by_status_and_system(carol: User) -> None:
    make_operation("p-unknown")
    make_operation("p-done", OperationStatus.SUCCEEDED)
    make_operation("m-unknown", system="mail")
    client = api_login(carol)

    assert keys(client.get(URL + "?status=unknown")) == ["m-unknown", "p-unknown"]
    assert keys(client.get(URL + "?system=payments")) == ["p-done", "p-unknown"]
    assert keys(client.get(URL + "?status=unknown&system=payments")) == ["p-unknown"]
    assert keys(client.get(URL + "?status=failed")) == []


@pytest.mark.parametrize(
    "query", ["?status=lost", "?colour=red", "?page_size=0", "?page_size=x", "?cursor=not-a-cursor"]
)
def test_bad_filters_are_400_with_the_error_shape(carol: User, query: str) -> None:
    response = api_login(carol).get(URL + query)
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid"


def test_pages_follow_the_cursor_newest_first_without_gaps_or_repeats(carol: User) -> None:
    for i in range(5):
        make_operation(f"op-{i}")
    client = api_login(carol)

    seen: list[str] = []
    url: str | None = URL + "?page_size=2"
    while url:
        page = client.get(url).json()
        assert len(page["results"]) <= 2
        seen += [op["key"] for op in page["results"]]
        url = page["next"]

    assert seen == [f"op-{i}" for i in reversed(range(5))]


def test_an_operation_shows_its_state_attention_and_redacted_data(carol: User) -> None:
    make_operation(
        "pd",
        sent_ago=timedelta(hours=1),
        note="no answer in time",
        request={"amount": "5.00", "customer": {"email": "alice@example.com", "Phone": "07700 900123"}},
    )

    response = api_login(carol).get(URL)

    [op] = response.json()["results"]
    assert op["status"] == "unknown" and op["attention"] == "unknown"
    assert op["note"] == "no answer in time"
    assert op["request"] == {"amount": "5.00", "customer": {"email": "[redacted]", "Phone": "[redacted]"}}
    assert "alice@example.com" not in response.content.decode()
    assert set(op) >= {
        "id",
        "key",
        "system",
        "action",
        "submit_count",
        "submitted_at",
        "resolved_by",
        "resolved_at",
        "resolution_note",
        "created_at",
    }


def test_the_operations_schema_generates_without_warnings_and_validates() -> None:
    GENERATOR_STATS.reset()
    generator = SchemaGenerator(patterns=[path("api/", include("ledger.urls"))])

    schema = generator.get_schema(request=None, public=True)

    assert not GENERATOR_STATS, "drf-spectacular warned: " + "; ".join(
        [*GENERATOR_STATS._warn_cache, *GENERATOR_STATS._error_cache]
    )
    validate_schema(schema)
    assert {op["operationId"] for item in schema["paths"].values() for op in item.values()} == {"operation_list"}
    assert set(schema["components"]["schemas"]["OperationStatus"]["enum"]) == set(OperationStatus.values)
