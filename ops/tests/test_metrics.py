"""``/metrics``: who may read it, and the values it reads from the database for rows made here."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from approvals.tests.support import waiting_request
from ledger.models import ExternalOperation, OperationStatus
from tests.factories import make_run
from webhooks.models import WebhookDelivery
from workflows import engine
from workflows.models import RunStatus, WorkflowRun

pytestmark = pytest.mark.django_db
TOKEN = "a-metrics-token-for-the-tests"


@pytest.fixture
def token(settings: Any) -> str:
    settings.METRICS_TOKEN = TOKEN
    return TOKEN


def scrape(**headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = Client().get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def test_metrics_needs_the_token(token: str) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Token {TOKEN}"}):
        response = Client().get("/metrics", headers=headers)
        assert response.status_code == 401, headers
        assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
        assert b"workflows_" not in response.content
    assert Client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_without_a_token_metrics_is_refused_unless_debug(settings: Any) -> None:
    settings.METRICS_TOKEN = ""
    settings.DEBUG = False
    assert Client().get("/metrics").status_code == 401
    settings.DEBUG = True
    assert Client().get("/metrics").status_code == 200


def test_the_database_gauges_count_the_rows_there_are(token: str) -> None:
    # given two queued runs and a waiting one of test.echo, a completed one, an operation whose
    # outcome has been unknown for two hours, and a request pending for half an hour
    now = timezone.now()
    for _ in range(2):
        make_run(status=RunStatus.QUEUED, enqueued_at=now - timedelta(minutes=5))
    make_run(status=RunStatus.WAITING, wake_at=now - timedelta(seconds=90))
    make_run(status=RunStatus.COMPLETED)
    ExternalOperation.objects.create(
        key="op-1", system="payments", action="refund", request_hash="", status=OperationStatus.UNKNOWN
    )
    ExternalOperation.objects.filter(key="op-1").update(submitted_at=now - timedelta(hours=2))
    request = waiting_request(expires_in=timedelta(minutes=40))
    type(request).objects.filter(pk=request.pk).update(created_at=now - timedelta(minutes=30))

    metrics = scrape(Authorization=f"Bearer {TOKEN}")

    assert metrics[("durable_database_up", ())] == 1
    assert metrics[("workflows_runs", (("status", "queued"), ("workflow", "test.echo")))] == 2
    assert metrics[("workflows_runs", (("status", "waiting"), ("workflow", "test.echo")))] == 1
    assert metrics[("workflows_runs", (("status", "running"), ("workflow", "test.echo")))] == 0
    assert not [key for key in metrics if key[0] == "workflows_runs" and ("status", "completed") in key[1]]
    assert 300 <= metrics[("workflows_oldest_queued_run_age_seconds", ())] < 330
    assert 90 <= metrics[("workflows_oldest_due_timer_age_seconds", ())] < 120
    assert metrics[("ledger_operations", (("status", "unknown"),))] == 1
    assert metrics[("ledger_operations", (("status", "pending"),))] == 0
    assert 7200 <= metrics[("ledger_oldest_unknown_operation_age_seconds", ())] < 7230
    # the approval fixture's run is a waiting run of test.wait; its request is the one pending
    assert metrics[("approvals_pending", ())] == 1
    assert 1800 <= metrics[("approvals_oldest_pending_age_seconds", ())] < 1830
    assert 2370 < metrics[("approvals_next_expiry_seconds", ())] <= 2400
    assert metrics[("agents_turns", (("status", "running"),))] == 0
    assert metrics[("agents_stream_lag_seconds", ())] == 0


def test_later_webhook_actions_not_done_are_counted_with_the_most_overdue_ones_age(token: str) -> None:
    # given two pending later actions, one due ten minutes ago and one not due yet, a failed one
    # and a done one
    now = timezone.now()

    def delivery(event_id: str, state: str, act_after: Any) -> None:
        WebhookDelivery.objects.create(
            source="later", event_id=event_id, outcome="accepted", action_state=state, act_after=act_after
        )

    delivery("evt_1", "pending", now - timedelta(minutes=10))
    delivery("evt_2", "pending", now + timedelta(seconds=30))
    delivery("evt_3", "failed", now - timedelta(hours=1))
    delivery("evt_4", "done", now - timedelta(hours=2))

    metrics = scrape(Authorization=f"Bearer {TOKEN}")

    assert metrics[("webhooks_later_actions", (("state", "pending"),))] == 2
    assert metrics[("webhooks_later_actions", (("state", "failed"),))] == 1
    assert 600 <= metrics[("webhooks_oldest_overdue_action_age_seconds", ())] < 630


def test_nothing_pending_reads_as_zero_ages_and_no_expiry(token: str) -> None:
    metrics = scrape(Authorization=f"Bearer {TOKEN}")
    assert metrics[("approvals_pending", ())] == 0
    assert metrics[("approvals_next_expiry_seconds", ())] == math.inf
    assert metrics[("ledger_oldest_unknown_operation_age_seconds", ())] == 0
    assert metrics[("workflows_oldest_due_timer_age_seconds", ())] == 0
    assert metrics[("webhooks_later_actions", (("state", "failed"),))] == 0
    assert metrics[("webhooks_oldest_overdue_action_age_seconds", ())] == 0


def test_a_run_recovered_here_counts_its_recovery_step_and_end(token: str, no_enqueue: Any) -> None:
    # given a run whose worker died mid-run: running, its lease expired, still naming that worker
    # (without PROMETHEUS_MULTIPROC_DIR the counters are this process's own, and add up over the session)
    def counted() -> dict[str, float]:
        metrics = scrape(Authorization=f"Bearer {TOKEN}")
        labels = (("outcome", "completed"), ("workflow", "test.echo"))
        return {
            "recoveries": metrics.get(("workflows_recoveries_total", (("reason", "lease_expired"),)), 0),
            "steps": metrics.get(("workflows_step_duration_seconds_count", labels), 0),
            "tries": metrics.get(("workflows_step_tries_count", labels), 0),
            "ended": metrics.get(
                ("workflows_runs_finished_total", (("reason", ""), ("status", "completed"), ("workflow", "test.echo"))),
                0,
            ),
        }

    run = make_run(
        status=RunStatus.RUNNING,
        payload={"n": 1},
        lease_owner="dead-worker",
        lease_expires_at=timezone.now() - timedelta(seconds=5),
    )
    before = counted()

    # when a worker (this process) claims and advances it
    assert engine.advance(run.id) == "completed"

    # then one recovery, one completed step (its one try) and one completed run more
    after = counted()
    assert {name: after[name] - before[name] for name in after} == {"recoveries": 1, "steps": 1, "tries": 1, "ended": 1}
    assert WorkflowRun.objects.get(pk=run.pk).recovery_count == 1


def test_a_token_of_spaces_is_no_token(settings: Any) -> None:
    settings.METRICS_TOKEN, settings.DEBUG = "   ", False
    assert Client().get("/metrics", headers={"Authorization": "Bearer    "}).status_code == 401
    settings.METRICS_TOKEN = f" {TOKEN} "  # spaces around it are a typo: the token still works
    assert Client().head("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_http_requests_are_timed_by_route_never_by_path(token: str) -> None:
    # given what this process counted so far (the histogram is the process's, as in a web process)
    def count(method: str, route: str, status: str) -> float:
        labels = (("method", method), ("route", route), ("status", status))
        return scrape(Authorization=f"Bearer {token}").get(("http_request_duration_seconds_count", labels), 0.0)

    before = {
        "probe": count("GET", "healthz", "2xx"),
        "run": count("GET", "api/runs/<str:run_id>", "4xx"),
        "nowhere": count("GET", "unmatched", "4xx"),
    }

    # when a probe, an API path with an id in it (not signed in: a 4xx) and a path that is nowhere
    Client().get("/healthz")
    Client().get("/api/runs/0d1e7b7c-8f4a-4c55-9d8e-2a0b3c4d5e6f")
    Client().get("/runs-of-someone/12345")

    # then each is counted once under its URL pattern, and the id or the typed path is no label
    assert count("GET", "healthz", "2xx") == before["probe"] + 1
    assert count("GET", "api/runs/<str:run_id>", "4xx") == before["run"] + 1
    assert count("GET", "unmatched", "4xx") == before["nowhere"] + 1
    body = Client().get("/metrics", headers={"Authorization": f"Bearer {token}"}).content.decode()
    assert "0d1e7b7c" not in body and "runs-of-someone" not in body
    assert 'http_request_duration_seconds_bucket{le="0.001",method="GET",route="healthz",status="2xx"}' in body
