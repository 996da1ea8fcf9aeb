"""The approvals HTTP API: list, detail, decision and its refusals (in-process, PostgreSQL), the
OpenAPI schema, and one decision end to end with a real worker resuming the run."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.urls import include, path
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest, ApprovalStatus, DecisionLog, DecisionResult
from approvals.tests.support import GROUP, assert_still_waiting, state, waiting_request
from approvals.tests.test_workflow import WAIT, waiting_for_approval
from tests.factories import Users, api_login
from tests.support import Worker, wait_for_terminal
from workflows import public as wf
from workflows.exceptions import InvalidPayload
from workflows.models import RunEvent, RunStatus, WorkflowRun

LIST = "/api/approvals"


def decision_url(request: ApprovalRequest | int) -> str:
    return f"/api/approvals/{request.pk if isinstance(request, ApprovalRequest) else request}/decision"


def post(client: APIClient, url: str, body: Any) -> Any:
    return client.post(url, json.dumps(body), content_type="application/json")


def error_of(response: Any) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "detail"}, body
    return dict(body["error"])


def ids(response: Any) -> list[int]:
    assert response.status_code == 200, response.content
    return [item["id"] for item in response.json()["results"]]


@pytest.mark.django_db
class TestList:
    def test_reviewers_list_the_requests_they_may_decide_oldest_first(self, users: Users) -> None:
        first = waiting_request(requested_by=users.bob)
        second = waiting_request(requested_by=users.carol)
        waiting_request(approvers="finance-approvers")
        decided = waiting_request(status=ApprovalStatus.APPROVED)

        response = api_login(users.carol).get(LIST, {"status": "pending"})

        assert ids(response) == [first.pk, second.pk]
        item = response.json()["results"][0]
        assert item["subject"] == {"type": "shop.order", "id": "1042"}
        assert (item["version"], item["status"], item["requested_by"], item["can_decide"]) == (
            "v1",
            "pending",
            "bob",
            True,
        )
        assert item["run"] == str(first.run_id)
        assert response.json()["results"][1]["can_decide"] is False  # carol asked for it herself
        assert ids(api_login(users.carol).get(LIST)) == [first.pk, second.pk, decided.pk]

    def test_staff_with_the_view_permission_and_decide_any_see_all_others_nothing(self, users: Users) -> None:
        ours = waiting_request()
        theirs = waiting_request(approvers="finance-approvers")

        assert ids(api_login(users.dave).get(LIST)) == [ours.pk, theirs.pk]
        assert ids(api_login(users.erin).get(LIST)) == [ours.pk, theirs.pk]
        assert ids(api_login(users.alice).get(LIST)) == []
        assert ids(api_login(users.mallory).get(LIST)) == []

    def test_bad_filters_and_no_credentials(self, users: Users) -> None:
        carol = api_login(users.carol)
        assert error_of(carol.get(LIST, {"status": "nope"}))["code"] == "invalid"
        assert carol.get(LIST, {"colour": "red"}).status_code == 400
        response = api_login(None).get(LIST)
        assert response.status_code == 401 and error_of(response)["code"] == "not_authenticated"

    def test_the_detail_shows_the_content_of_the_version(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob, content={"amount": "120.00"})

        response = api_login(users.carol).get(f"/api/approvals/{request.pk}")

        assert response.status_code == 200
        assert response.json()["content"] == {"amount": "120.00"}
        assert response.json()["superseded_by"] is None
        for who, url in [
            ("mallory", f"/api/approvals/{request.pk}"),
            ("carol", "/api/approvals/999999"),
            ("carol", "/api/approvals/abc"),
        ]:
            response = api_login(getattr(users, who)).get(url)
            assert response.status_code == 404 and error_of(response)["code"] == "not_found"


@pytest.mark.django_db
class TestDecision:
    def test_approve_returns_the_request_and_wakes_the_run(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)

        response = post(api_login(users.carol), decision_url(request), {"approve": True, "version": "v1", "note": "ok"})

        assert response.status_code == 200, response.content
        body = response.json()
        assert (body["status"], body["decided_by"], body["note"], body["can_decide"]) == (
            "approved",
            "carol",
            "ok",
            False,
        )
        assert RunEvent.objects.get(run=request.run).type == f"approval:{request.pk}"
        assert DecisionLog.objects.get(request=request).channel == "api"

    def test_a_replayed_post_is_the_established_result(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)
        carol = api_login(users.carol)
        first = post(carol, decision_url(request), {"approve": False, "version": "v1"})

        again = post(carol, decision_url(request), {"approve": False, "version": "v1"})

        assert first.status_code == again.status_code == 200
        assert again.json() == first.json()
        assert RunEvent.objects.filter(run=request.run).count() == 1

    @pytest.mark.parametrize(
        "who, body, code, http_status",
        [
            ("dave", {"approve": True, "version": "v1"}, "not_authorised", 403),  # sees it, may not decide
            ("bob", {"approve": True, "version": "v1"}, "four_eyes", 403),  # asked for it
            ("carol", {"approve": True, "version": "v0"}, "stale_version", 409),
        ],
    )
    def test_refusals_change_nothing(
        self, users: Users, who: str, body: dict[str, Any], code: str, http_status: int
    ) -> None:
        request = waiting_request(requested_by=users.bob)
        before = state(request)

        response = post(api_login(getattr(users, who)), decision_url(request), body)

        assert response.status_code == http_status
        error = error_of(response)
        assert error["code"] == code
        assert error["detail"] == {"status": "pending", "version": "v1", "superseded_by": None}
        assert_still_waiting(request, before)
        assert DecisionLog.objects.get(request=request).result == DecisionResult.REFUSED

    @pytest.mark.parametrize(
        "status", [ApprovalStatus.EXPIRED, ApprovalStatus.REJECTED, ApprovalStatus.SUPERSEDED, ApprovalStatus.CANCELLED]
    )
    def test_a_closed_request_is_a_409_naming_its_state(self, users: Users, status: str) -> None:
        request = waiting_request(requested_by=users.bob, status=status)
        before = state(request)

        response = post(api_login(users.carol), decision_url(request), {"approve": True, "version": "v1"})

        assert response.status_code == 409
        error = error_of(response)
        assert (error["code"], error["detail"]["status"]) == ("not_pending", status)
        assert status in error["message"]
        assert_still_waiting(request, before)

    def test_the_opposite_decision_and_a_late_one_are_409s(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)
        post(api_login(users.carol), decision_url(request), {"approve": True, "version": "v1"})
        late = waiting_request(requested_by=users.bob, expires_in=timedelta(seconds=-1))

        opposite = post(api_login(users.erin), decision_url(request), {"approve": False, "version": "v1"})
        too_late = post(api_login(users.carol), decision_url(late), {"approve": True, "version": "v1"})

        assert opposite.status_code == 409 and error_of(opposite)["detail"]["status"] == "approved"
        assert too_late.status_code == 409 and error_of(too_late)["code"] == "expired"
        assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.APPROVED
        assert ApprovalRequest.objects.get(pk=late.pk).status == ApprovalStatus.PENDING

    def test_requests_the_caller_may_not_see_are_404s_whatever_the_body(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)
        before = state(request)

        for who, url in [
            ("mallory", decision_url(request)),
            ("alice", decision_url(request)),
            ("carol", decision_url(999999)),
            ("carol", "/api/approvals/x/decision"),
        ]:
            response = post(api_login(getattr(users, who)), url, {"nonsense": 1})
            assert response.status_code == 404 and error_of(response)["code"] == "not_found", who
        assert post(api_login(None), decision_url(request), {}).status_code == 401
        assert_still_waiting(request, before)
        assert not DecisionLog.objects.exists()

    @pytest.mark.parametrize(
        "body",
        [
            {"approve": "yes", "version": "v1"},
            {"approve": 1, "version": "v1"},
            {"version": "v1"},
            {"approve": True},
            {"approve": True, "version": 1},
            {"approve": True, "version": "v1", "extra": 1},
            {"approve": True, "version": "v1", "note": "x" * 3000},
            [True, "v1"],
        ],
    )
    def test_bad_bodies_are_400s_and_change_nothing(self, users: Users, body: Any) -> None:
        request = waiting_request(requested_by=users.bob)
        before = state(request)

        response = post(api_login(users.carol), decision_url(request), body)

        assert response.status_code == 400, response.content
        assert error_of(response)["code"] in ("invalid", "parse_error")
        assert_still_waiting(request, before)

    def test_malformed_json_is_a_400(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)
        response = api_login(users.carol).post(decision_url(request), "{not json", content_type="application/json")
        assert response.status_code == 400 and error_of(response)["code"] == "parse_error"

    def test_session_auth_needs_csrf(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)
        client = api_login(users.carol, via="session", enforce_csrf_checks=True)

        response = post(client, decision_url(request), {"approve": True, "version": "v1"})

        assert response.status_code == 403
        assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.PENDING


@pytest.mark.django_db
@pytest.mark.django_db
@pytest.mark.parametrize(
    "event",
    [
        {"type": "approval:{id}", "payload": {"request_id": "{id}", "approved": True, "version": "v1"}},
        {"type": "noise", "idempotency_key": "approval:{id}:decision"},  # would block the real decision's event
    ],
)
def test_the_owner_of_a_waiting_run_cannot_post_the_event_of_a_decision(users: Users, event: dict[str, Any]) -> None:
    # given alice's run, waiting for a request only a reviewer may decide
    request = waiting_request(requested_by=users.alice)
    WorkflowRun.objects.filter(pk=request.run_id).update(owner=users.alice)
    before = state(request)
    body = json.loads(json.dumps(event).replace('"{id}"', str(request.pk)).replace("{id}", str(request.pk)))

    # when she posts what a decision would send, through the runs API and through Python
    response = post(api_login(users.alice), f"/api/runs/{request.run_id}/events", body)
    with pytest.raises(InvalidPayload) as python:
        wf.send_event(request.run_id, body["type"], body.get("payload"), idempotency_key=body.get("idempotency_key"))

    # then both are refused with nothing recorded: the request still waits for a reviewer
    assert response.status_code == 400, response.json()
    assert "reserved" in error_of(response)["message"] and "reserved" in str(python.value)
    assert_still_waiting(request, before)


def test_the_schema_describes_the_approvals_api_without_warnings() -> None:
    GENERATOR_STATS.reset()
    generator = SchemaGenerator(patterns=[path("api/", include("approvals.urls"))])

    schema = generator.get_schema(request=None, public=True)

    assert not GENERATOR_STATS, "drf-spectacular warned: " + "; ".join(
        [*GENERATOR_STATS._warn_cache, *GENERATOR_STATS._error_cache]
    )
    validate_schema(schema)
    operations = {op["operationId"] for item in schema["paths"].values() for op in item.values()}
    assert operations == {"approval_list", "approval_retrieve", "approval_decide"}


@pytest.mark.django_db(transaction=True)
def test_a_decision_over_the_api_resumes_the_run(worker: Worker, users: Users) -> None:
    run = wf.start("approvals.test.simple", {"approvers": GROUP, "requested_by": users.bob.pk})
    request = waiting_for_approval(run)

    response = post(api_login(users.carol), decision_url(request), {"approve": True, "version": "v1"})

    assert response.status_code == 200
    run = wait_for_terminal(run.id, timeout=WAIT)
    assert run.result is not None, run.error
    assert run.status == RunStatus.COMPLETED and run.result["by"] == "carol"
