"""The HTTP API of runs: in-process requests against PostgreSQL, and two end-to-end tests with a
real Celery worker advancing the runs the API starts."""

from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

import pytest
from django.contrib.auth.models import User
from django.contrib.staticfiles import finders
from django.urls import include, path
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

from tests.factories import Users, api_login
from tests.support import Worker, wait_for
from workflows import services
from workflows.apis.errors import body_limit
from workflows.models import (
    TERMINAL,
    RunAttempt,
    RunEvent,
    RunStatus,
    StepKind,
    StepResult,
    StepStatus,
    WorkflowRun,
)


# --- helpers --------------------------------------------------------------------------------------
def start_url(name: str = "test.echo") -> str:
    return f"/api/workflows/{name}/runs"


def run_url(run_id: object, action: str = "") -> str:
    return f"/api/runs/{run_id}" + (f"/{action}" if action else "")


def post_raw(client: APIClient, url: str, body: bytes, content_type: str = "application/json", **headers: str) -> Any:
    # bytes, not str: some bodies here are deliberately not UTF-8 (the stubs say str; DRF takes both)
    return client.generic("POST", url, body, content_type=content_type, headers=headers)  # type: ignore[arg-type]


def error_of(response: Any) -> dict[str, Any]:
    """The error body, after checking it has exactly the API's error shape."""
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "detail"}, body
    return dict(body["error"])


def a_run(owner: User, workflow: str = "test.echo", **payload: Any) -> WorkflowRun:
    run, _ = services.run_start(workflow=workflow, payload=payload, owner=owner)
    return run


def snapshot(run: WorkflowRun) -> tuple[Any, ...]:
    """What a refused control must leave unchanged."""
    run.refresh_from_db()
    return (run.status, run.attempt, run.pause_requested, run.finished_at, RunAttempt.objects.filter(run=run).count())


# --- authentication -------------------------------------------------------------------------------
@pytest.mark.django_db
def test_unauthenticated_requests_are_401_and_start_nothing() -> None:
    client = api_login(None)

    start = client.post(start_url(), {"payload": {}}, format="json")
    listing = client.get("/api/runs")

    assert start.status_code == 401 and listing.status_code == 401
    assert error_of(start)["code"] == "not_authenticated"
    assert start.headers["WWW-Authenticate"] == "Token"
    assert WorkflowRun.objects.count() == 0


@pytest.mark.django_db
def test_a_wrong_token_is_401(users: Users) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")

    response = client.post(start_url(), {"payload": {}}, format="json")

    assert response.status_code == 401
    assert error_of(response)["code"] == "authentication_failed"
    assert WorkflowRun.objects.count() == 0


@pytest.mark.django_db
def test_session_authentication_works_and_enforces_csrf(users: Users) -> None:
    # given alice logged in with a session, and a client that checks CSRF as a browser's would
    client = api_login(users.alice, via="session", enforce_csrf_checks=True)

    # when she reads, then writes without and with the CSRF token
    listing = client.get("/api/runs")
    without_token = client.post(start_url(), {"payload": {}}, format="json")
    client.cookies["csrftoken"] = "a" * 32
    with_token = client.post(start_url(), {"payload": {}}, format="json", headers={"X-CSRFToken": "a" * 32})

    # then reading works, the write without the token is refused and changes nothing
    assert listing.status_code == 200
    assert without_token.status_code == 403
    assert error_of(without_token)["code"] == "permission_denied"
    assert "CSRF" in error_of(without_token)["message"]
    assert with_token.status_code == 201
    assert WorkflowRun.objects.count() == 1


# --- starting runs --------------------------------------------------------------------------------
@pytest.mark.django_db
def test_start_creates_a_run_owned_by_the_caller(users: Users) -> None:
    response = api_login(users.alice).post(start_url(), {"payload": {"order_id": 1042}}, format="json")

    assert response.status_code == 201
    body = response.json()
    run = WorkflowRun.objects.get()
    assert body["id"] == str(run.id)
    assert body["workflow"] == "test.echo"
    assert body["status"] == "queued"
    assert body["attempt"] == 1
    assert body["owner"] == "alice"
    assert response.headers["Location"] == f"/api/runs/{run.id}"
    assert run.owner == users.alice
    assert run.payload == {"order_id": 1042}
    assert list(RunAttempt.objects.filter(run=run).values_list("number", flat=True)) == [1]


@pytest.mark.django_db
def test_start_without_a_body_starts_with_an_empty_payload(users: Users) -> None:
    response = api_login(users.alice).post(start_url())

    assert response.status_code == 201
    assert WorkflowRun.objects.get().payload == {}


@pytest.mark.django_db
def test_same_key_and_payload_returns_the_existing_run(users: Users) -> None:
    client = api_login(users.alice)
    headers = {"Idempotency-Key": "order-1042"}

    first = client.post(start_url(), {"payload": {"order_id": 1042}}, format="json", headers=headers)
    again = client.post(start_url(), {"payload": {"order_id": 1042}}, format="json", headers=headers)

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["idempotency_key"] == "order-1042"
    assert WorkflowRun.objects.count() == 1
    assert RunAttempt.objects.count() == 1


@pytest.mark.django_db
def test_same_key_with_another_payload_is_409_and_changes_nothing(users: Users) -> None:
    # given a run started with a key
    client = api_login(users.alice)
    headers = {"Idempotency-Key": "order-1042"}
    client.post(start_url(), {"payload": {"order_id": 1042}}, format="json", headers=headers)

    # when the key is reused with another payload
    response = client.post(start_url(), {"payload": {"order_id": 9999}}, format="json", headers=headers)

    # then it is a conflict, and the stored run is untouched
    assert response.status_code == 409
    assert error_of(response)["code"] == "idempotency_conflict"
    assert WorkflowRun.objects.count() == 1
    assert WorkflowRun.objects.get().payload == {"order_id": 1042}


@pytest.mark.django_db
def test_idempotency_keys_belong_to_the_caller(users: Users) -> None:
    headers = {"Idempotency-Key": "shared-key"}

    alices = api_login(users.alice).post(start_url(), {"payload": {"a": 1}}, format="json", headers=headers)
    mallorys = api_login(users.mallory).post(start_url(), {"payload": {"m": 2}}, format="json", headers=headers)

    # Mallory gets her own run: neither a conflict nor a sight of Alice's run.
    assert (alices.status_code, mallorys.status_code) == (201, 201)
    assert alices.json()["id"] != mallorys.json()["id"]
    assert WorkflowRun.objects.get(pk=mallorys.json()["id"]).owner == users.mallory


@pytest.mark.django_db
@pytest.mark.parametrize(
    "name, payload",
    [
        ("refund", {"request_id": 1, "order": "1041"}),
        ("supplier-assessment", {"assessment_id": 1, "requested_by_id": 1}),
        ("test.lines", {"path": "/tmp/x", "steps": 1}),
    ],
)
def test_a_workflow_that_is_not_public_is_403_and_starts_nothing(
    users: Users, name: str, payload: dict[str, Any]
) -> None:
    """A process with its own service (a refund, an assessment) starts only through it: anyone
    else's ids in a payload would otherwise run someone else's process as theirs."""
    response = api_login(users.mallory).post(start_url(name), {"payload": payload}, format="json")

    assert response.status_code == 403
    error = error_of(response)
    assert error["code"] == "not_startable"
    assert f"workflow {name!r} cannot be started directly" in error["message"]
    assert WorkflowRun.objects.count() == 0


@pytest.mark.django_db
def test_the_workflow_validates_the_payload_even_from_its_own_services(users: Users) -> None:
    from workflows.exceptions import InvalidPayload

    with pytest.raises(InvalidPayload, match="request_id must be a positive integer id"):
        services.run_start(workflow="refund", payload={"request_id": "1; drop", "order": "1"}, owner=users.alice)
    with pytest.raises(InvalidPayload, match="unknown payload keys: admin"):
        services.run_start(workflow="refund", payload={"request_id": 1, "order": "1", "admin": True})
    assert WorkflowRun.objects.count() == 0


@pytest.mark.django_db
def test_unknown_workflow_is_404_and_starts_nothing(users: Users) -> None:
    response = api_login(users.alice).post(start_url("no.such.workflow"), {"payload": {}}, format="json")

    assert response.status_code == 404
    error = error_of(response)
    assert error["code"] == "unknown_workflow"
    assert "no.such.workflow" in error["message"]
    assert WorkflowRun.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        pytest.param(b'{"payload": ', "parse_error", None, id="malformed JSON"),
        pytest.param(b'{"payload": {"x": NaN}}', "parse_error", None, id="NaN is not JSON"),
        pytest.param(b"\xff\xfe", "parse_error", None, id="not UTF-8"),
        pytest.param(b"[1, 2]", "invalid", "non_field_errors", id="body is a list"),
        pytest.param(b'{"payload": [1, 2]}', "invalid", "payload", id="payload is a list"),
        pytest.param(b'{"payload": "text"}', "invalid", "payload", id="payload is a string"),
        pytest.param(b'{"payload": null}', "invalid", "payload", id="payload is null"),
        pytest.param(b'{"order_id": 1042}', "invalid", "order_id", id="bare object: unknown field"),
        pytest.param(b'{"payload": {"note": "a\\u0000b"}}', "invalid_payload", None, id="NUL PostgreSQL cannot store"),
    ],
)
def test_start_refuses_bad_input_and_starts_nothing(users: Users, body: bytes, code: str, field: str | None) -> None:
    response = post_raw(api_login(users.alice), start_url(), body)

    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == code
    if field is not None:
        assert field in error["detail"]
    assert WorkflowRun.objects.count() == 0
    assert RunAttempt.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["", "   ", "k" * 256], ids=["empty", "blank", "too long"])
def test_start_refuses_a_bad_idempotency_key(users: Users, key: str) -> None:
    response = api_login(users.alice).post(
        start_url(), {"payload": {}}, format="json", headers={"Idempotency-Key": key}
    )

    assert response.status_code == 400
    assert "Idempotency-Key" in error_of(response)["detail"]
    assert WorkflowRun.objects.count() == 0


@pytest.mark.django_db
def test_start_refuses_a_body_that_is_not_json(users: Users) -> None:
    response = post_raw(api_login(users.alice), start_url(), b"payload=1", "application/x-www-form-urlencoded")

    assert response.status_code == 415
    assert error_of(response)["code"] == "unsupported_media_type"
    assert WorkflowRun.objects.count() == 0


@pytest.mark.django_db
def test_an_oversize_body_is_413_and_starts_nothing(users: Users) -> None:
    body = json.dumps({"payload": {"blob": "x" * body_limit()}}).encode()

    response = post_raw(api_login(users.alice), start_url(), body)

    assert response.status_code == 413
    assert error_of(response)["code"] == "payload_too_large"
    assert WorkflowRun.objects.count() == 0


@pytest.mark.django_db
def test_a_payload_over_the_limit_is_413_even_when_the_body_fits(users: Users, settings: Any) -> None:
    # given a payload limit of 1,000 bytes (the body limit adds room for the envelope)
    settings.WORKFLOWS = {**settings.WORKFLOWS, "MAX_PAYLOAD_BYTES": 1000}

    # when a payload of just over 1,000 bytes is sent
    response = api_login(users.alice).post(start_url(), {"payload": {"blob": "x" * 1000}}, format="json")

    # then it is refused as too large, not as merely invalid
    assert response.status_code == 413
    assert error_of(response)["code"] == "payload_too_large"
    assert WorkflowRun.objects.count() == 0


@pytest.mark.django_db
def test_a_wrong_method_is_405_in_the_error_shape(users: Users) -> None:
    response = api_login(users.alice).get(start_url())

    assert response.status_code == 405
    assert error_of(response)["code"] == "method_not_allowed"


# --- listing runs ---------------------------------------------------------------------------------
def listed_ids(response: Any) -> set[str]:
    assert response.status_code == 200, response.content
    return {item["id"] for item in response.json()["results"]}


@pytest.mark.django_db
def test_each_caller_lists_only_their_runs_and_staff_list_all(users: Users) -> None:
    # given two runs of alice and one of mallory
    alices = {str(a_run(users.alice).id), str(a_run(users.alice).id)}
    mallorys = {str(a_run(users.mallory).id)}

    # then each sees their own; carol (staff with the view permission) sees all; bob sees none
    assert listed_ids(api_login(users.alice).get("/api/runs")) == alices
    assert listed_ids(api_login(users.mallory).get("/api/runs")) == mallorys
    assert listed_ids(api_login(users.carol).get("/api/runs")) == alices | mallorys
    assert listed_ids(api_login(users.bob).get("/api/runs")) == set()


@pytest.mark.django_db
def test_list_filters_by_status_and_workflow(users: Users) -> None:
    alice = users.alice
    echo, wait = a_run(alice), a_run(alice, "test.wait")
    services.run_terminate(run_id=echo.id)
    client = api_login(alice)

    assert listed_ids(client.get("/api/runs", {"status": "terminated"})) == {str(echo.id)}
    assert listed_ids(client.get("/api/runs", {"status": "queued"})) == {str(wait.id)}
    assert listed_ids(client.get("/api/runs", {"workflow": "test.wait"})) == {str(wait.id)}
    assert listed_ids(client.get("/api/runs", {"workflow": "test.wait", "status": "terminated"})) == set()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"status": "exploded"}, "status"),
        ({"page_size": "0"}, "page_size"),
        ({"page_size": "many"}, "page_size"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"cursor": "cD1ub3QtYS1kYXRl"}, "cursor"),  # base64 of p=not-a-date: a forged position
        ({"owner": "alice"}, "owner"),
    ],
    ids=[
        "unknown status",
        "zero page size",
        "page size not a number",
        "garbled cursor",
        "forged cursor",
        "unknown filter",
    ],
)
def test_list_refuses_bad_query_parameters(users: Users, query: dict[str, str], field: str) -> None:
    a_run(users.alice)

    response = api_login(users.alice).get("/api/runs", query)

    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "invalid"
    assert field in error["detail"]


@pytest.mark.django_db
def test_a_query_parameter_given_twice_is_refused_not_read_as_its_last_value(users: Users) -> None:
    run = a_run(users.alice)
    client = api_login(users.alice)

    for url in (
        "/api/runs?status=completed&status=failed",
        "/api/runs?page_size=1&page_size=2&status=completed",
        f"/api/runs/{run.id}?x=1&x=2",
        "/api/agents/support/help/submissions?status=pending&status=completed",
    ):
        response = client.get(url)

        assert response.status_code == 400, url
        detail = error_of(response)["detail"]
        assert list(detail) in (["status"], ["page_size"], ["x"]) and "more than once" in str(detail), url
    assert client.get("/api/runs?status=completed").status_code == 200


@pytest.mark.django_db
def test_a_query_parameter_to_an_endpoint_that_reads_none_is_refused_not_ignored(users: Users) -> None:
    run = a_run(users.alice, "test.wait")
    client = api_login(users.alice)

    terminate = client.post(run_url(run.id, "terminate") + "?force=1", {}, format="json")
    detail = client.get(run_url(run.id) + "?expand=steps")
    start = client.post(start_url() + "?dry_run=1", {"payload": {}}, format="json")

    for response, name in ((terminate, "force"), (detail, "expand"), (start, "dry_run")):
        assert response.status_code == 400
        assert error_of(response)["detail"] == {name: ["Unknown query parameter."]}
    assert WorkflowRun.objects.get(pk=run.pk).status != RunStatus.TERMINATED
    assert WorkflowRun.objects.count() == 1  # nothing started either
    assert client.get(run_url(run.id)).status_code == 200


@pytest.mark.django_db
def test_list_pages_through_every_run_once_newest_first(users: Users) -> None:
    # given five runs
    ids = [str(a_run(users.alice, n=i).id) for i in range(5)]
    client = api_login(users.alice)

    # when the caller follows the next links two at a time
    seen: list[str] = []
    pages = 0
    url: str | None = "/api/runs?page_size=2"
    while url:
        body = client.get(url).json()
        seen += [item["id"] for item in body["results"]]
        url = body["next"]
        pages += 1

    # then every run appears once, newest first
    assert pages == 3
    assert seen == list(reversed(ids))


# --- a run's detail -------------------------------------------------------------------------------
@pytest.mark.django_db
def test_detail_shows_steps_attempts_and_what_the_run_waits_for(users: Users) -> None:
    # given a run whose first step completed and which now waits for an event
    run = a_run(users.alice, order_id=1042)
    StepResult.objects.create(
        run=run,
        attempt=1,
        position=1,
        name="load order",
        kind=StepKind.DO,
        status=StepStatus.COMPLETED,
        result={"total": 120},
        tries=1,
    )
    StepResult.objects.create(
        run=run, attempt=1, position=2, name="wait for reply", kind=StepKind.WAIT, status=StepStatus.WAITING
    )
    # status is a protected FSM field: a queryset update stands in for the engine here
    WorkflowRun.objects.filter(pk=run.pk).update(
        status=RunStatus.WAITING,
        wait_step="wait for reply",
        wait_event_type="reply",
        wake_at="2030-01-01T00:00:00Z",
        progress={"stage": "asked"},
    )

    # when alice reads it
    response = api_login(users.alice).get(run_url(run.id))

    # then she sees the timeline, the attempt, and what it waits for until when
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "waiting"
    assert body["payload"] == {"order_id": 1042}
    assert body["progress"] == {"stage": "asked"}
    assert body["waiting_for"] == {
        "step": "wait for reply",
        "event_type": "reply",
        "until": "2030-01-01T00:00:00+00:00",
    }
    assert [(s["position"], s["name"], s["kind"], s["status"], s["result"]) for s in body["steps"]] == [
        (1, "load order", "do", "completed", {"total": 120}),
        (2, "wait for reply", "wait", "waiting", None),
    ]
    assert [(a["number"], a["status"]) for a in body["attempts"]] == [(1, "waiting")]
    assert (body["result"], body["error"], body["failure_reason"]) == (None, None, "")

    # and once it is terminated, it waits for nothing (its wait's fields stay, for the record)
    WorkflowRun.objects.filter(pk=run.pk).update(status=RunStatus.TERMINATED)
    assert api_login(users.alice).get(run_url(run.id)).json()["waiting_for"] is None


@pytest.mark.django_db
def test_another_owners_run_is_404_like_a_missing_one(users: Users) -> None:
    run = a_run(users.alice)
    mallory = api_login(users.mallory)

    others = mallory.get(run_url(run.id))
    missing = mallory.get(run_url(uuid4()))
    malformed = mallory.get(run_url("not-a-uuid"))

    assert others.status_code == missing.status_code == malformed.status_code == 404
    # the same answer in all three cases: nothing confirms that alice's run exists
    assert error_of(others) == error_of(missing) == error_of(malformed)
    assert error_of(others)["code"] == "not_found"
    assert api_login(users.carol).get(run_url(run.id)).status_code == 200


@pytest.mark.django_db
def test_a_failed_runs_traceback_is_for_staff_only(users: Users) -> None:
    run = a_run(users.alice)
    error = {"type": "KeyError", "message": "'order_id'", "traceback": 'Traceback ...\n  File "/srv/app.py"'}
    WorkflowRun.objects.filter(pk=run.pk).update(status=RunStatus.FAILED, error=error, failure_reason="error")

    as_owner = api_login(users.alice).get(run_url(run.id)).json()
    as_staff = api_login(users.carol).get(run_url(run.id)).json()

    assert as_owner["error"] == {"type": "KeyError", "message": "'order_id'"}
    assert as_owner["failure_reason"] == "error"
    assert as_staff["error"] == error


# --- events ---------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_an_event_is_created_once_per_key(users: Users) -> None:
    run = a_run(users.alice, "test.wait")
    client = api_login(users.alice)
    event = {"type": "reply", "payload": {"answer": 42}, "idempotency_key": "reply-1"}

    first = client.post(run_url(run.id, "events"), event, format="json")
    again = client.post(run_url(run.id, "events"), event, format="json")

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert first.json()["run"] == str(run.id)
    assert first.json()["payload"] == {"answer": 42}
    assert RunEvent.objects.filter(run=run).count() == 1


@pytest.mark.django_db
def test_an_event_key_reused_with_another_payload_is_409(users: Users) -> None:
    run = a_run(users.alice, "test.wait")
    client = api_login(users.alice)
    client.post(
        run_url(run.id, "events"), {"type": "reply", "payload": {"answer": 42}, "idempotency_key": "k"}, format="json"
    )

    response = client.post(
        run_url(run.id, "events"), {"type": "reply", "payload": {"answer": 7}, "idempotency_key": "k"}, format="json"
    )

    assert response.status_code == 409
    assert error_of(response)["code"] == "idempotency_conflict"
    assert list(RunEvent.objects.filter(run=run).values_list("payload", flat=True)) == [{"answer": 42}]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        pytest.param(b'{"type": "reply", ', 400, None, id="malformed JSON"),
        pytest.param(b'{"payload": {}}', 400, "type", id="no type"),
        pytest.param(b'{"type": ""}', 400, "type", id="empty type"),
        pytest.param(b'{"type": 5}', 400, "type", id="type is a number"),
        pytest.param(b'{"type": "reply", "idempotency_key": 5}', 400, "idempotency_key", id="key is a number"),
        pytest.param(
            b'{"type": "reply", "idempotency_key": " k"}', 400, "idempotency_key", id="key starts with a space"
        ),
        pytest.param(b'{"type": "reply", "idempotency_key": "k\\n"}', 400, "idempotency_key", id="key with a newline"),
        pytest.param(
            b'{"type": "reply", "idempotency_key": "caf\xc3\xa9"}', 400, "idempotency_key", id="key not ASCII"
        ),
        pytest.param(b'{"type": "reply", "payload": null}', 400, "payload", id="payload is null"),
        pytest.param(b'{"type": "reply", "answer": 42}', 400, "answer", id="unknown field"),
        pytest.param(b'{"type": "reply", "payload": "' + b"x" * 300_000 + b'"}', 413, None, id="oversize"),
        pytest.param(b'{"type": "reply", "payload": {"\\u0000": 1}}', 400, None, id="NUL in a key"),
    ],
)
def test_send_event_refuses_bad_input_and_records_nothing(
    users: Users, body: bytes, status: int, field: str | None
) -> None:
    run = a_run(users.alice, "test.wait")

    response = post_raw(api_login(users.alice), run_url(run.id, "events"), body)

    assert response.status_code == status
    if field is not None:
        assert field in error_of(response)["detail"]
    assert RunEvent.objects.count() == 0


@pytest.mark.django_db
def test_a_run_holds_a_bounded_number_of_events_no_step_has_taken(users: Users, settings: Any) -> None:
    # given a run that may hold 3 events no step has taken, and holds 3
    settings.WORKFLOWS = {**settings.WORKFLOWS, "MAX_WAITING_EVENTS_PER_RUN": 3}
    run = a_run(users.alice, "test.wait")
    client = api_login(users.alice)
    for n in range(3):
        sent = client.post(run_url(run.id, "events"), {"type": "spam", "idempotency_key": f"k{n}"}, format="json")
        assert sent.status_code == 201

    # when alice sends one more, it is refused and nothing is stored
    refused = client.post(run_url(run.id, "events"), {"type": "spam", "payload": {"n": 4}}, format="json")
    assert refused.status_code == 429
    assert error_of(refused)["code"] == "too_many_events"
    assert "3 events no step has taken" in error_of(refused)["message"]
    assert RunEvent.objects.filter(run=run).count() == 3

    # and a replay of one she sent is still answered, and the app's own events are never refused
    assert (
        client.post(run_url(run.id, "events"), {"type": "spam", "idempotency_key": "k0"}, format="json").status_code
        == 200
    )
    _, created = services.run_send_event(run_id=run.id, type="decision", payload={"approve": True}, system=True)
    assert created

    # then once steps have taken some (the decision counts while no step has taken it), there is room again
    taken = RunEvent.objects.filter(run=run, type="decision") | RunEvent.objects.filter(run=run, idempotency_key="k0")
    assert taken.update(consumed_attempt=1, consumed_position=1) == 2
    assert client.post(run_url(run.id, "events"), {"type": "spam"}, format="json").status_code == 201
    assert client.post(run_url(run.id, "events"), {"type": "spam"}, format="json").status_code == 429


@pytest.mark.django_db
def test_an_event_for_a_finished_run_is_409_with_its_status(users: Users) -> None:
    run = a_run(users.alice, "test.wait")
    services.run_terminate(run_id=run.id)

    response = api_login(users.alice).post(run_url(run.id, "events"), {"type": "reply"}, format="json")

    assert response.status_code == 409
    error = error_of(response)
    assert error["code"] == "transition_not_allowed"
    assert error["detail"] == {"status": "terminated"}
    assert RunEvent.objects.count() == 0


@pytest.mark.django_db
def test_who_may_send_events_to_alices_run(users: Users) -> None:
    run = a_run(users.alice, "test.wait")
    event = {"type": "reply", "payload": {"answer": 42}}

    as_mallory = api_login(users.mallory).post(run_url(run.id, "events"), event, format="json")
    as_dave = api_login(users.dave).post(run_url(run.id, "events"), event, format="json")
    nothing_yet = RunEvent.objects.count()
    as_carol = api_login(users.carol).post(run_url(run.id, "events"), event, format="json")

    assert as_mallory.status_code == 404  # she may not even know the run exists
    assert as_dave.status_code == 403  # he may see it, not act on it
    assert error_of(as_dave)["code"] == "permission_denied"
    assert nothing_yet == 0
    assert as_carol.status_code == 201  # staff with the control permission


# --- control --------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_pause_resume_terminate_restart_and_the_refusals_between(users: Users) -> None:
    run = a_run(users.alice)
    client = api_login(users.alice)

    def control(action: str) -> Any:
        return client.post(run_url(run.id, action))

    # a body with a field in it is refused, not ignored: only restart reads one ("attempt")
    before = snapshot(run)
    for action in ("pause", "resume", "terminate"):
        with_a_field = client.post(run_url(run.id, action), {"attempt": 1}, format="json")
        assert with_a_field.status_code == 400 and error_of(with_a_field)["detail"] == {"attempt": ["Unknown field."]}
        assert client.post(run_url(run.id, action), [1], format="json").status_code == 400, action
    assert snapshot(run) == before

    # a queued run pauses at once (an empty object is no body); pausing again is refused and changes nothing
    assert client.post(run_url(run.id, "pause"), {}, format="json").json()["status"] == "paused"
    before = snapshot(run)
    again = control("pause")
    assert again.status_code == 409
    assert error_of(again)["code"] == "transition_not_allowed"
    assert error_of(again)["detail"] == {"status": "paused"}
    assert snapshot(run) == before

    # resumed, it is queued again; terminated, it is final
    assert control("resume").json()["status"] == "queued"
    terminated = control("terminate").json()
    assert terminated["status"] == "terminated" and terminated["finished_at"] is not None
    before = snapshot(run)
    for action in ("pause", "resume", "terminate"):
        refused = control(action)
        assert refused.status_code == 409, action
        assert error_of(refused)["detail"] == {"status": "terminated"}
    assert snapshot(run) == before

    # restarted, it is a new attempt; the first stays visible
    restarted = control("restart").json()
    assert restarted["status"] == "queued"
    assert restarted["attempt"] == 2
    assert [(a["number"], a["status"]) for a in restarted["attempts"]] == [(1, "terminated"), (2, "queued")]

    # a restart of the attempt the caller saw: once, however often it is sent
    url = run_url(run.id, "restart")
    assert client.post(url, {"attempt": 2}, format="json").json()["attempt"] == 3
    before = snapshot(run)
    twice = client.post(url, {"attempt": 2}, format="json")
    assert twice.status_code == 409 and error_of(twice)["detail"] == {"status": "queued"}
    assert "it is on attempt 3 now, not attempt 2 (restarted already?)" in error_of(twice)["message"]
    ahead = client.post(url, {"attempt": 9}, format="json")
    assert ahead.status_code == 409 and "not attempt 9 (it has had no attempt 9)" in error_of(ahead)["message"]
    assert snapshot(run) == before
    for bad in ({"attempt": 0}, {"attempt": "2x"}, {"attempts": 2}):
        assert client.post(url, bad, format="json").status_code == 400, bad
    assert snapshot(run) == before


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["pause", "resume", "terminate", "restart"])
def test_who_may_control_alices_run(users: Users, action: str) -> None:
    # given alice's run, paused so that every action has something to do
    run = a_run(users.alice)
    services.run_pause(run_id=run.id)
    before = snapshot(run)

    # when mallory, then dave (staff who may only view) try the action
    as_mallory = api_login(users.mallory).post(run_url(run.id, action))
    as_dave = api_login(users.dave).post(run_url(run.id, action))

    # then mallory gets a 404, dave a 403, and the run is as it was
    assert as_mallory.status_code == 404
    assert error_of(as_mallory)["code"] == "not_found"
    # a body the action would refuse tells her no more than that (not a 400 from reading it)
    with_a_bad_body = api_login(users.mallory).post(run_url(run.id, action), {"attempt": "x"}, format="json")
    assert with_a_bad_body.status_code == 404
    assert as_dave.status_code == 403
    assert error_of(as_dave)["code"] == "permission_denied"
    assert snapshot(run) == before
    # carol, staff with the control permission, gets past the check to the run's state machine
    # (which refuses to pause a run that is already paused)
    as_carol = api_login(users.carol).post(run_url(run.id, action))
    assert as_carol.status_code == {"pause": 409, "resume": 200, "terminate": 200, "restart": 200}[action]


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["pause", "resume", "terminate", "restart", "events"])
def test_the_owner_of_a_private_workflows_run_may_see_it_but_not_drive_it(users: Users, action: str) -> None:
    """A refund or an assessment is driven by its own service: its customer stopping or restarting
    the run midway would leave the process half done (a refund terminated while its outcome is
    unknown). Staff with the control permission still can."""
    # given alice's run of a private workflow (test.lines: not public), paused
    run, _ = services.run_start(workflow="test.lines", payload={"path": "/dev/null", "steps": 1}, owner=users.alice)
    services.run_pause(run_id=run.id)
    before = snapshot(run)
    body = {"type": "reply"} if action == "events" else None

    # when alice tries
    response = api_login(users.alice).post(run_url(run.id, action), body, format="json")

    # then she may see it (403, not 404), and nothing changed
    assert response.status_code == 403
    assert "driven by its own process" in error_of(response)["message"]
    assert api_login(users.alice).get(run_url(run.id)).status_code == 200
    assert snapshot(run) == before
    assert not RunEvent.objects.filter(run=run).exists()
    as_carol = api_login(users.carol).post(run_url(run.id, action), body, format="json")
    assert as_carol.status_code in (200, 201, 409)


@pytest.mark.django_db
def test_staff_with_the_control_permission_can_pause_anyones_run(users: Users) -> None:
    run = a_run(users.mallory)

    response = api_login(users.carol).post(run_url(run.id, "pause"))

    assert response.status_code == 200
    assert response.json()["status"] == "paused"
    assert response.json()["owner"] == "mallory"


# --- OpenAPI --------------------------------------------------------------------------------------
def test_the_runs_api_schema_generates_without_warnings() -> None:
    GENERATOR_STATS.reset()
    patterns = [path("api/", include("workflows.apis.urls"))]
    generator = SchemaGenerator(patterns=patterns)

    schema = generator.get_schema(request=None, public=True)

    assert not GENERATOR_STATS, "drf-spectacular warned: " + "; ".join(
        [*GENERATOR_STATS._warn_cache, *GENERATOR_STATS._error_cache]
    )
    validate_schema(schema)
    operations = {op["operationId"] for item in schema["paths"].values() for op in item.values()}
    # plus one start operation for each public workflow that states its payload
    assert operations - {"run_start_demo_onboarding"} == {
        "run_start",
        "run_list",
        "run_retrieve",
        "run_send_event",
        "run_pause",
        "run_resume",
        "run_terminate",
        "run_restart",
    }


@pytest.mark.django_db
def test_the_schema_endpoint_serves_the_runs_api() -> None:
    response = api_login(None).get("/api/schema/", {"format": "json"})

    assert response.status_code == 200
    paths = json.loads(response.content)["paths"]
    assert {
        "/api/workflows/{name}/runs",
        "/api/runs",
        "/api/runs/{run_id}",
        "/api/runs/{run_id}/events",
        "/api/runs/{run_id}/pause",
    } <= set(paths)


@pytest.mark.django_db
def test_the_docs_page_is_swagger_ui_from_local_assets() -> None:
    response = api_login(None).get("/api/docs/")

    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in html
    assert "cdn.jsdelivr.net" not in html  # the machine may have no internet
    assert finders.find("drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js") is not None


# --- end to end, with a real worker ---------------------------------------------------------------
def poll_until(client: APIClient, run_id: str, *statuses: str, timeout: float = 30.0) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        body: dict[str, Any] = client.get(run_url(run_id)).json()
        return body if body["status"] in statuses else None

    body = wait_for(reached, timeout=timeout, what=f"run {run_id} to be {'/'.join(statuses)}")
    assert body is not None
    return body


@pytest.mark.django_db(transaction=True)
def test_a_run_started_through_the_api_completes_with_its_timeline(worker: Worker, users: Users) -> None:
    # given alice starts an echo run through the API
    client = api_login(users.alice)
    started = client.post(
        start_url("test.echo"),
        {"payload": {"greeting": "hello"}},
        format="json",
        headers={"Idempotency-Key": "e2e-echo"},
    )
    assert started.status_code == 201

    # when a real worker advances it
    body = poll_until(client, started.json()["id"], "completed", "failed", "terminated")

    # then the API shows the result, the one step and the finished attempt
    assert body["status"] == "completed", body
    assert body["result"] == {"greeting": "hello"}
    assert body["error"] is None
    assert [(s["attempt"], s["position"], s["name"], s["kind"], s["status"], s["result"]) for s in body["steps"]] == [
        (1, 1, "echo", "do", "completed", {"greeting": "hello"})
    ]
    assert [(a["number"], a["status"], a["result"]) for a in body["attempts"]] == [
        (1, "completed", {"greeting": "hello"})
    ]
    assert body["started_at"] and body["finished_at"]


@pytest.mark.django_db(transaction=True)
def test_an_event_sent_through_the_api_resumes_a_waiting_run(worker: Worker, users: Users) -> None:
    # given a run that waits for a "reply" event
    client = api_login(users.alice)
    run_id = client.post(start_url("test.wait"), {"payload": {"timeout": 30}}, format="json").json()["id"]
    waiting = poll_until(client, run_id, "waiting")
    assert waiting["waiting_for"]["event_type"] == "reply"
    assert waiting["waiting_for"]["step"] == "wait for reply"

    # when alice sends the reply (twice, as a retrying client would)
    event = {"type": "reply", "payload": {"answer": 42}, "idempotency_key": "reply-1"}
    sent = client.post(run_url(run_id, "events"), event, format="json")
    resent = client.post(run_url(run_id, "events"), event, format="json")

    # then the run resumes with the event's payload, and the second send was the same event
    assert (sent.status_code, resent.status_code) == (201, 200)
    body = poll_until(client, run_id, "completed", "failed", "terminated")
    assert body["status"] == "completed", body
    assert body["result"]["reply"] == {"answer": 42}
    assert [(s["name"], s["status"]) for s in body["steps"]] == [
        ("wait for reply", "completed"),
        ("after", "completed"),
    ]
    assert RunEvent.objects.filter(run_id=run_id).count() == 1
    assert RunEvent.objects.get(run_id=run_id).consumed_at is not None

    # and a run that finished takes no more events
    late = client.post(run_url(run_id, "events"), {"type": "reply"}, format="json")
    assert late.status_code == 409
    assert error_of(late)["detail"] == {"status": "completed"}
    assert RunEvent.objects.filter(run_id=run_id).count() == 1


@pytest.mark.django_db
def test_one_person_may_have_only_so_many_runs_going(users: Users, settings: Any) -> None:
    """A customer starting public workflows in a loop must not take every worker from everyone
    else: past WORKFLOWS_MAX_ACTIVE_RUNS_PER_OWNER unfinished runs, a 429 that starts nothing."""
    settings.WORKFLOWS = {**settings.WORKFLOWS, "MAX_ACTIVE_RUNS_PER_OWNER": 3, "PUBLIC_QUEUE": "public-runs"}
    mallory = api_login(users.mallory)
    started = [
        mallory.post(start_url(), {"payload": {"n": i}}, format="json", headers={"Idempotency-Key": f"k{i}"})
        for i in range(3)
    ]
    assert [r.status_code for r in started] == [201, 201, 201]
    assert {WorkflowRun.objects.get(pk=r.json()["id"]).queue for r in started} == {"public-runs"}

    # when she starts a fourth
    fourth = mallory.post(start_url(), {"payload": {"n": 3}}, format="json")

    # then it is refused, and nothing was started; a replay of a key still answers; others are not limited
    assert fourth.status_code == 429 and error_of(fourth)["code"] == "too_many_runs"
    assert WorkflowRun.objects.filter(owner=users.mallory).count() == 3
    again = mallory.post(start_url(), {"payload": {"n": 0}}, format="json", headers={"Idempotency-Key": "k0"})
    assert again.status_code == 200
    assert api_login(users.alice).post(start_url(), {"payload": {}}, format="json").status_code == 201
    # and once one of hers has finished, she may start another
    services.run_terminate(run_id=started[0].json()["id"])
    assert mallory.post(start_url(), {"payload": {"n": 4}}, format="json").status_code == 201


@pytest.mark.django_db
def test_terminating_and_restarting_does_not_get_past_the_run_limit(users: Users, settings: Any) -> None:
    settings.WORKFLOWS = {**settings.WORKFLOWS, "MAX_ACTIVE_RUNS_PER_OWNER": 2}
    mallory = api_login(users.mallory)
    first, second = (mallory.post(start_url(), {"payload": {"n": i}}, format="json").json()["id"] for i in range(2))
    # given one of her two runs terminated and a new one started in its place: at her limit again
    services.run_terminate(run_id=first)
    assert mallory.post(start_url(), {"payload": {"n": 2}}, format="json").status_code == 201
    before = snapshot(WorkflowRun.objects.get(pk=first))

    # when she restarts the terminated one, then it is refused as a start would be, and nothing changed
    refused = mallory.post(run_url(first, "restart"), {"attempt": 1}, format="json")
    assert refused.status_code == 429 and error_of(refused)["code"] == "too_many_runs", refused.content
    assert snapshot(WorkflowRun.objects.get(pk=first)) == before
    assert WorkflowRun.objects.filter(owner=users.mallory).exclude(status__in=TERMINAL).count() == 2

    # a run of hers not yet finished is restarted in place (still as many unfinished)
    assert mallory.post(run_url(second, "restart"), format="json").status_code == 200
    # and staff may restart the finished one for her
    assert api_login(users.carol).post(run_url(first, "restart"), {"attempt": 1}, format="json").status_code == 200
    # the attempt is a JSON number, as the schema says
    for bad in ("2", "٥", True):
        assert mallory.post(run_url(second, "restart"), {"attempt": bad}, format="json").status_code == 400, bad


@pytest.mark.django_db(transaction=True)
def test_the_run_limit_holds_for_starts_sent_together_and_counts_only_public_runs(users: Users, settings: Any) -> None:
    from tests.support import race

    settings.WORKFLOWS = {**settings.WORKFLOWS, "MAX_ACTIVE_RUNS_PER_OWNER": 3}
    # given mallory's runs of a private workflow (a refund's, an assessment's: not counted)
    for _ in range(4):
        services.run_start(workflow="test.lines", payload={"path": "/dev/null", "steps": 1}, owner=users.mallory)

    # when she sends eight starts of a public one at the same instant (runs that wait: a worker of
    # the session, if one runs, must not finish them and free their places)
    answers = race(
        lambda: api_login(users.mallory).post(start_url("test.wait"), {"payload": {"timeout": 300}}, format="json"),
        n=8,
    )

    # then exactly three were started
    assert sorted(a.status_code for a in answers) == [201] * 3 + [429] * 5
    assert WorkflowRun.objects.filter(owner=users.mallory, workflow="test.wait").count() == 3
    assert (
        "you have 3 runs that have not finished yet (the limit is 3)"
        in error_of([a for a in answers if a.status_code == 429][0])["message"]
    )
