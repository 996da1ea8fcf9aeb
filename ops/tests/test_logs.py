"""One structured line per state change: its context as JSON keys, never the payload."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from ops.logformat import JsonFormatter, RequestPathFilter
from tests.factories import Users, login, make_run
from tests.support import ROOT, service_env
from workflows import engine
from workflows.models import RunStatus
from workflows.services import run_start

pytestmark = pytest.mark.django_db
SECRET = "alice@example.com"


def json_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    formatter = JsonFormatter()
    return [json.loads(formatter.format(record)) for record in caplog.records]


def test_a_runs_state_changes_log_json_lines_with_their_context_and_no_payload(
    caplog: pytest.LogCaptureFixture,
    django_capture_on_commit_callbacks: Callable[..., Any],
    no_enqueue: Any,
) -> None:
    caplog.set_level(logging.INFO)
    # given a run started with a customer's email in its payload, then advanced here
    with django_capture_on_commit_callbacks(execute=True):
        run, _ = run_start(workflow="test.echo", payload={"email": SECRET})
    assert engine.advance(run.id) == "completed"

    lines = json_lines(caplog)
    by_event = {line["event"]: line for line in lines if "event" in line}
    # then each change of state has its line, with its context as keys of its own
    assert {"run.created", "run.started", "step.completed", "run.completed"} <= set(by_event)
    step = by_event["step.completed"]
    assert (step["run_id"], step["attempt"], step["step"], step["workflow"]) == (str(run.id), 1, "echo", "test.echo")
    assert step["level"] == "INFO" and step["logger"] == "workflows.runs" and step["tries"] == 1
    assert by_event["run.completed"]["run_id"] == str(run.id)
    # and the payload (echoed as the step's and the run's result) is in none of them
    assert not [line for line in lines if SECRET in json.dumps(line)]


def test_a_failed_step_logs_its_error_type_never_its_message(caplog: pytest.LogCaptureFixture, no_enqueue: Any) -> None:
    caplog.set_level(logging.INFO)
    run = make_run(
        workflow="test.flaky",
        status=RunStatus.QUEUED,
        payload={"path": f"/nonexistent/{SECRET}/lines", "fail_times": 0, "limit": 0},
        enqueued_at=timezone.now() - timedelta(seconds=1),
    )
    engine.advance(run.id)  # the step cannot write its file: FileNotFoundError naming the path

    failed = [line for line in json_lines(caplog) if line.get("event") == "step.failed"]
    assert len(failed) == 1 and failed[0]["error_type"] == "FileNotFoundError", failed
    assert not [line for line in json_lines(caplog) if SECRET in json.dumps(line)]


def test_log_format_json_makes_every_line_a_json_object() -> None:
    code = (
        "import django, logging; django.setup(); "
        "logging.getLogger('workflows.runs').info('run r started', "
        "extra={'event': 'run.started', 'run_id': 'r', 'attempt': 1, 'data': {'args': ['a payload']}})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=service_env(LOG_FORMAT="json", DJANGO_SETTINGS_MODULE="config.settings"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stderr.strip().splitlines()[-1])
    assert {k: line[k] for k in ("level", "logger", "message", "event", "run_id", "attempt")} == {
        "level": "INFO",
        "logger": "workflows.runs",
        "message": "run r started",
        "event": "run.started",
        "run_id": "r",
        "attempt": 1,
    }
    assert "data" not in line and "a payload" not in done.stderr  # an extra not listed is not copied


def test_request_lines_name_the_route_not_the_path_a_client_typed() -> None:
    # given the logging configuration's filter on the handler a line is written through
    handler = logging.StreamHandler(io.StringIO())
    handler.addFilter(RequestPathFilter())
    logging.getLogger("django.request").addHandler(handler)
    try:
        client = Client()
        client.get("/jane.doe@example.com/?token=abc")  # no route
        client.get("/api/runs/12345678")  # a route, a run nobody has
    finally:
        logging.getLogger("django.request").removeHandler(handler)

    written = handler.stream.getvalue()
    assert "Not Found: a path no route matches" in written
    assert "Unauthorized: route api/runs/<" in written  # (no credentials: a 401, on its route)
    assert "jane.doe" not in written and "abc" not in written and "12345678" not in written


def test_a_refusal_names_the_route_without_a_traceback(users: Users) -> None:
    # Django writes "Forbidden (Permission denied): <path>" with the path as its only argument, and
    # the exception's traceback: carol (staff) may not delete a run, nor see the tokens
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.addFilter(RequestPathFilter())
    logging.getLogger("django.request").addHandler(handler)
    try:
        client = login(users.carol)
        run = make_run(owner=users.alice)
        assert client.get(f"/admin/workflows/workflowrun/{run.pk}/delete/").status_code == 403
        assert client.get("/admin/authtoken/tokenproxy/?q=secret-ish").status_code == 403
    finally:
        logging.getLogger("django.request").removeHandler(handler)

    written = handler.stream.getvalue()
    assert written.count("WARNING Forbidden (Permission denied): route admin/") == 2, written
    assert str(run.pk) not in written and "secret-ish" not in written
    assert "Traceback" not in written


def test_a_refusal_formatted_by_another_handler_first_comes_without_its_traceback(users: Users) -> None:
    # with DEBUG on, Django's console handler formats the record before ours, and logging keeps the
    # traceback's text on the record (exc_text): ours must not print it from there
    first = logging.StreamHandler(io.StringIO())
    ours = logging.StreamHandler(io.StringIO())
    ours.addFilter(RequestPathFilter())
    request_logger = logging.getLogger("django.request")
    request_logger.addHandler(first)
    request_logger.addHandler(ours)
    try:
        assert login(users.carol).get("/admin/authtoken/tokenproxy/").status_code == 403
    finally:
        request_logger.removeHandler(first)
        request_logger.removeHandler(ours)

    assert "Traceback" in first.stream.getvalue()  # the other handler wrote it
    written = ours.stream.getvalue()
    assert "Forbidden (Permission denied): route admin/" in written and "Traceback" not in written


def test_a_csrf_refusal_names_the_route_not_the_path(users: Users) -> None:
    handler = logging.StreamHandler(io.StringIO())
    handler.addFilter(RequestPathFilter())
    csrf_logger = logging.getLogger("django.security.csrf")
    csrf_logger.addHandler(handler)
    try:
        client = login(users.alice, enforce_csrf_checks=True)
        assert client.post("/chat/support/SEKRET5/", {"text": "hi"}).status_code == 403
    finally:
        csrf_logger.removeHandler(handler)

    written = handler.stream.getvalue()
    assert "): route chat/<name:kind>/<name:name>/" in written and "Forbidden (CSRF" in written, written
    assert "SEKRET5" not in written


def test_a_host_not_allowed_is_one_line_without_a_traceback() -> None:
    # anyone can send a request with a Host of their choosing: Django logs it at ERROR, with its traceback
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    handler.addFilter(RequestPathFilter())
    security_logger = logging.getLogger("django.security")
    security_logger.addHandler(handler)
    try:
        assert Client(HTTP_HOST="evil.example").get("/healthz").status_code == 400
    finally:
        security_logger.removeHandler(handler)

    written = handler.stream.getvalue()
    assert written.startswith("ERROR django.security.DisallowedHost Invalid HTTP_HOST header: 'evil.example'")
    assert "Traceback" not in written and written.count("\n") == 1
