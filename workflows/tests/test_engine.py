"""The engine end to end: runs started here, advanced by a real Celery worker on PostgreSQL."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from tests.fixtures import NoEnqueue
from tests.support import Worker, wait_for, wait_for_status, wait_for_terminal
from tests.workflows_fixtures import lines
from workflows import public as wf
from workflows.models import RunStatus, StepResult, StepStatus, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)


def test_steps_run_once_and_return_their_results(worker: Worker, tmp_path: Path) -> None:
    path = str(tmp_path / "lines")
    run = wf.start("test.lines", {"path": path, "steps": 4})

    run = wait_for_terminal(run.id)

    assert run.status == RunStatus.COMPLETED
    assert run.result == [0, 1, 2, 3]
    assert lines(path) == ["0", "1", "2", "3"]
    assert list(StepResult.objects.filter(run=run).values_list("name", "status")) == [
        (f"step {i}", StepStatus.COMPLETED) for i in range(4)
    ]


def test_a_replayed_run_does_not_run_completed_steps_again(worker: Worker, tmp_path: Path) -> None:
    # given a run that stops between its steps (a sleep)
    run = wf.start("test.sleep", {"seconds": 1})

    # when it wakes and replays from the top
    run = wait_for_terminal(run.id)

    # then the step before the sleep answered from storage: had it run again after the sleep,
    # its timestamp would be as late as the one after it
    before = StepResult.objects.get(run=run, name="before")
    assert run.status == RunStatus.COMPLETED
    assert run.result is not None, run.error
    assert run.result["slept"] >= 1
    assert before.tries == 1
    assert [s.name for s in StepResult.objects.filter(run=run)] == ["before", "nap", "after"]


def test_retries_back_off_then_succeed(worker: Worker, tmp_path: Path) -> None:
    path = str(tmp_path / "tries")
    run = wf.start("test.flaky", {"path": path, "fail_times": 2, "delay": 0.3, "backoff": "constant"})

    run = wait_for_terminal(run.id)

    assert run.status == RunStatus.COMPLETED, run.error
    assert run.result == "ok"
    tries = [float(line.split()[1]) for line in lines(path)]
    assert len(tries) == 3
    assert all(b - a >= 0.3 for a, b in zip(tries, tries[1:]))
    step = StepResult.objects.get(run=run)
    assert (step.status, step.tries) == (StepStatus.COMPLETED, 3)


@pytest.mark.parametrize(
    ("backoff", "expected"),
    [("constant", [0.5, 0.5, 0.5]), ("linear", [0.5, 1.0, 1.5]), ("exponential", [0.5, 1.0, 2.0])],
)
def test_each_backoff_spaces_the_tries(worker: Worker, tmp_path: Path, backoff: str, expected: list[float]) -> None:
    path = str(tmp_path / "tries")
    run = wf.start("test.flaky", {"path": path, "fail_times": 3, "delay": 0.5, "backoff": backoff})

    run = wait_for_terminal(run.id)

    assert run.status == RunStatus.COMPLETED
    tries = [float(line.split()[1]) for line in lines(path)]
    gaps = [b - a for a, b in zip(tries, tries[1:])]
    assert len(gaps) == 3
    for gap, minimum in zip(gaps, expected):
        assert minimum <= gap < minimum + 0.45  # fired by the countdown, not left to a later sweep


def test_a_step_out_of_retries_fails_the_run_with_its_error(worker: Worker, tmp_path: Path) -> None:
    path = str(tmp_path / "tries")
    run = wf.start("test.flaky", {"path": path, "fail_times": 10, "limit": 2, "delay": 0.1})

    run = wait_for_terminal(run.id)

    assert run.status == RunStatus.FAILED
    assert run.failure_reason == "error"
    assert run.error is not None, run.status
    assert run.error["type"] == "ValueError"
    assert run.error["message"] == "failure 3"
    assert len(lines(path)) == 3  # the first try and two retries
    assert StepResult.objects.get(run=run).status == StepStatus.FAILED


def test_non_retryable_error_fails_the_step_at_once_and_run_may_catch_it(worker: Worker, tmp_path: Path) -> None:
    path = str(tmp_path / "tries")
    run = wf.start("test.flaky", {"path": path, "fail_times": 5, "non_retryable": True, "catch": True})

    run = wait_for_terminal(run.id)

    assert run.status == RunStatus.COMPLETED
    assert run.result == {"caught": "NonRetryableError", "message": "the card was declined"}
    assert len(lines(path)) == 1


def test_a_step_past_its_timeout_fails(worker: Worker) -> None:
    started = time.monotonic()
    run = wf.start("test.timeout", {"seconds": 20, "timeout": 0.5})

    run = wait_for_terminal(run.id)

    assert run.status == RunStatus.FAILED
    assert run.error is not None, run.status
    assert run.error["type"] == "StepTimeout"
    assert "timeout of 0.5s" in run.error["message"]
    assert time.monotonic() - started < 15


def test_non_determinism_fails_the_run_naming_both_steps(worker: Worker, tmp_path: Path) -> None:
    # given a run that recorded its first step as "first name", then slept
    flag = tmp_path / "flag"
    run = wf.start("test.nondeterminism", {"flag": str(flag), "seconds": 1.5})
    wait_for_status(run.id, RunStatus.SLEEPING)

    # when the code reaches another name at that position on replay
    flag.write_text("changed")
    run = wait_for_terminal(run.id)

    # then the run fails rather than doing anything wrong
    assert run.status == RunStatus.FAILED
    assert run.failure_reason == "non_determinism"
    assert run.error is not None, run.status
    assert "'first name'" in run.error["message"] and "'second name'" in run.error["message"]


def test_a_sleeping_run_says_until_when(worker: Worker) -> None:
    run = wf.start("test.sleep", {"seconds": 3})

    run = wait_for_status(run.id, RunStatus.SLEEPING)

    assert run.wait_step == "nap"
    assert run.wake_at is not None
    assert run.lease_owner == ""


def test_wait_for_event_resumes_with_its_payload(worker: Worker) -> None:
    run = wf.start("test.wait", {"timeout": 60})
    run = wait_for_status(run.id, RunStatus.WAITING)
    assert (run.wait_event_type, run.wait_step) == ("reply", "wait for reply")

    wf.send_event(run, "reply", {"text": "yes"}, idempotency_key="r1")
    wf.send_event(run, "reply", {"text": "yes"}, idempotency_key="r1")  # a retried send

    run = wait_for_terminal(run.id)
    assert run.status == RunStatus.COMPLETED
    assert run.result is not None, run.error
    assert run.result["reply"] == {"text": "yes"}
    assert run.events.count() == 1


def test_an_event_sent_before_the_wait_is_kept_for_it(worker: Worker) -> None:
    run = wf.start("test.wait", {"timeout": 60})
    wf.send_event(run, "reply", {"early": True})

    run = wait_for_terminal(run.id)

    assert run.result is not None, run.error
    assert run.result["reply"] == {"early": True}


def test_wait_for_event_times_out(worker: Worker) -> None:
    run = wf.start("test.wait", {"timeout": 1})

    run = wait_for_terminal(run.id, timeout=20)

    assert run.status == RunStatus.COMPLETED
    assert run.result == {"timed_out": True}
    wait = StepResult.objects.get(run=run, name="wait for reply")
    assert wait.error is not None
    assert wait.status == StepStatus.FAILED and wait.error["type"] == "WaitTimeout"


def test_a_step_sent_to_another_queue_runs_there_once(worker: Worker, tmp_path: Path, settings: Any) -> None:
    path = str(tmp_path / "lines")
    run = wf.start("test.dispatch", {"path": path, "queue": settings.WORKFLOWS["QUEUE"] + "-io"})

    run = wait_for_terminal(run.id)

    assert run.status == RunStatus.COMPLETED, run.error
    assert run.result == [0, 1]
    assert lines(path) == ["0", "1"]


def test_atomic_step_commits_body_and_result_together(worker: Worker, tmp_path: Path) -> None:
    from django.contrib.auth.models import Group

    run = wf.start("test.atomic", {"group": "atomic-ok", "path": str(tmp_path / "x")})

    run = wait_for_terminal(run.id)

    group = Group.objects.get(name="atomic-ok")
    assert run.result == group.pk


def test_results_too_large_or_not_json_fail_the_step_clearly_and_at_once(worker: Worker) -> None:
    run = wf.start("test.big", {})

    run = wait_for_terminal(run.id)

    assert run.status == RunStatus.COMPLETED, run.error
    assert run.result is not None, run.error
    assert "the limit is 1,048,576 (WORKFLOWS_MAX_RESULT_BYTES)" in run.result["too_big"]
    assert "not JSON-serialisable" in run.result["not_json"]
    assert set(StepResult.objects.filter(run=run).values_list("status", "tries")) == {(StepStatus.FAILED, 1)}


def test_heartbeat_keeps_a_long_step_from_being_recovered(worker: Worker, tmp_path: Path, settings: Any) -> None:
    # given a step three times as long as the lease (WORKFLOWS_LEASE_SECONDS=2 in the tests)
    path = str(tmp_path / "lines")
    run = wf.start("test.lines", {"path": path, "steps": 2, "slow_step": 0, "slow_seconds": 6})

    run = wait_for_terminal(run.id)

    # then no other worker took the run over while the step ran
    assert run.status == RunStatus.COMPLETED
    assert lines(path) == ["0", "1"]
    assert run.recovery_count == 0


def test_the_sweeper_fires_timers_from_the_database(worker: Worker) -> None:
    # given a run sleeping for long (no Celery countdown is sent for it)
    from workflows.models import WorkflowRun

    run = wf.start("test.sleep", {"seconds": 3600})
    wait_for_status(run.id, RunStatus.SLEEPING)

    # when its timer falls due (moved into the past)
    past = timezone.now() - timedelta(seconds=1)
    StepResult.objects.filter(run=run, name="nap").update(wake_at=past)
    WorkflowRun.objects.filter(pk=run.pk).update(wake_at=past)

    # then beat's sweep wakes it and it completes
    run = wait_for_terminal(run.id, timeout=15)
    assert run.status == RunStatus.COMPLETED


def test_a_run_of_a_workflow_that_no_longer_exists_fails_clearly(worker: Worker, no_enqueue: NoEnqueue) -> None:
    from workflows.models import WorkflowRun
    from workflows.outbox import enqueue_run

    # given a run whose workflow is gone by the time a worker takes it (held back until then)
    run = wf.start("test.echo", {})
    WorkflowRun.objects.filter(pk=run.pk).update(workflow="gone.away")
    no_enqueue.stop()
    enqueue_run(run.id, queue=run.queue)

    run = wait_for_terminal(run.id)

    assert run.status == RunStatus.FAILED
    assert run.failure_reason == "unknown_workflow"


def test_a_step_body_knows_its_run_and_step(worker: Worker) -> None:
    from workflows import current_step

    run = wf.start("test.context", {})

    run = wait_for_terminal(run.id)

    assert run.result == {"run": str(run.id), "attempt": 1, "step": "where am I"}
    assert current_step() is None  # outside a step body


# --- what PostgreSQL cannot store (issue 6 item 7) -----------------------------------------------
@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("surrogate", "an unpaired surrogate (\\ud800), which is not valid Unicode"),
        ("nul", "a NUL character (\\u0000), which cannot be stored"),
    ],
)
def test_a_step_result_postgresql_cannot_store_fails_that_step_at_once(
    worker: Worker, tmp_path: Path, kind: str, problem: str
) -> None:
    # given a step in the middle of a run that returns a lone surrogate or a NUL in nested JSON
    path = str(tmp_path / "lines")
    run = wf.start("test.unstorable", {"path": path, "kind": kind})

    run = wait_for_terminal(run.id)

    # then that step failed for good, once, with a clear error the run caught, and the run went on
    message = f"the result of step 'unstorable' contains {problem}"
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.result == {"caught": {"type": "NotSerializable", "message": message}}
    assert lines(path) == ["before", kind, "after"]
    steps = StepResult.objects.filter(run=run)
    assert [(s.name, s.status, s.tries) for s in steps] == [
        ("before", StepStatus.COMPLETED, 1),
        ("unstorable", StepStatus.FAILED, 1),
        ("after", StepStatus.COMPLETED, 1),
    ]
    assert run.recovery_count == 0


@pytest.mark.parametrize("kind", ["surrogate", "nul"])
def test_an_unstorable_result_of_the_last_step_fails_the_run_without_running_any_step_again(
    worker: Worker, tmp_path: Path, kind: str
) -> None:
    # given a run whose last step returns what PostgreSQL cannot store, and returns it as the run's result
    path = str(tmp_path / "lines")
    run = wf.start("test.unstorable", {"path": path, "kind": kind, "last": True})

    run = wait_for_terminal(run.id)

    # then the run failed with that step's error; no step ran twice, no recovery
    assert run.status == RunStatus.FAILED
    assert run.error is not None, run.status
    assert (run.failure_reason, run.error["type"]) == ("error", "NotSerializable")
    assert run.error["message"].startswith("the result of step 'unstorable' contains ")
    assert lines(path) == ["before", kind]
    assert run.recovery_count == 0
    assert StepResult.objects.get(run=run, name="unstorable").status == StepStatus.FAILED


@pytest.mark.parametrize("kind", ["surrogate", "nul"])
def test_a_run_result_postgresql_cannot_store_fails_the_run(worker: Worker, tmp_path: Path, kind: str) -> None:
    path = str(tmp_path / "lines")
    run = wf.start("test.unstorable", {"path": path, "kind": kind, "as_result": True})

    run = wait_for_terminal(run.id)

    assert run.status == RunStatus.FAILED
    assert run.error is not None, run.status
    assert run.error["type"] == "NotSerializable"
    assert run.error["message"].startswith("the run's result contains")
    assert lines(path) == ["before"]
    assert run.recovery_count == 0
    assert StepResult.objects.get(run=run, name="before").status == StepStatus.COMPLETED


def test_a_run_end_postgresql_refuses_fails_the_run_and_runs_no_step_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    # given an encoder that lets everything through (as one with a gap would), and a run advanced
    # here on a queue no worker listens on
    from workflows import engine, step_store
    from workflows.sweeper import sweep

    settings.WORKFLOWS = {**settings.WORKFLOWS, "QUEUE": f"nobody-{uuid.uuid4().hex[:8]}"}
    monkeypatch.setattr(step_store, "encode", lambda value, *, what: (value, json.dumps(value)))
    path = str(tmp_path / "lines")
    run = wf.start("test.unstorable", {"path": path, "kind": "surrogate", "last": True})

    # when its last step's result and the run's own reach the run's end, where PostgreSQL refuses them
    outcome = engine.advance(run.id)

    # then the run failed with the database's error, the step is stored as failed, and nothing
    # is left for recovery to run again
    run.refresh_from_db()
    assert (outcome, run.status, run.failure_reason) == ("failed", RunStatus.FAILED, "error")
    assert run.error is not None, run.status
    assert run.error["type"] == "DataError"
    assert run.error["message"].startswith("the run's end could not be stored")
    last = StepResult.objects.get(run=run, name="unstorable")
    assert last.error is not None
    assert (last.status, last.tries, last.result, last.error["type"]) == (StepStatus.FAILED, 1, None, "DataError")
    assert (run.lease_owner, run.lease_expires_at) == ("", None)
    assert engine.advance(run.id) == "not_claimed"
    assert sweep(now=timezone.now() + timedelta(hours=1)).requeued == 0
    assert lines(path) == ["before", "surrogate"]


# --- step timeouts (item 8) ----------------------------------------------------------------------
@pytest.mark.parametrize("timeout", [0, -1])
def test_a_step_timeout_of_zero_or_less_is_refused(worker: Worker, timeout: float) -> None:
    run = wf.start("test.timeout", {"seconds": 0, "timeout": timeout})

    run = wait_for_terminal(run.id)

    assert run.status == RunStatus.FAILED
    assert run.error is not None, run.status
    assert run.error["type"] == "ValueError"
    assert run.error["message"] == f"step 'slow': timeout must be more than 0 seconds, not {float(timeout)}"
    assert not StepResult.objects.filter(run=run).exists()


def test_a_body_that_swallows_its_timeout_and_returns_late_is_a_timed_out_try(worker: Worker, tmp_path: Path) -> None:
    # given a body that catches StepTimeout on its first try and returns a little later
    path = str(tmp_path / "lines")
    run = wf.start("test.stuck", {"how": "swallow", "path": path, "hold": 0.5, "timeout": 0.5})

    run = wait_for_terminal(run.id)

    # then that late result was not stored: the try counted as timed out and the retry's result is the step's
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.result == "second try"
    assert lines(path) == ["try", "swallowed", "woke", "try"]
    step = StepResult.objects.get(run=run)
    assert (step.status, step.tries, step.result) == (StepStatus.COMPLETED, 2, "second try")


@pytest.mark.parametrize("atomic", [False, True])
def test_a_query_interrupted_by_the_timeout_is_cancelled_and_the_worker_goes_on(
    worker: Worker, tmp_path: Path, atomic: bool
) -> None:
    # given a body in a 60-second query on its first try, with a timeout of 1 second
    from django.db import connection

    marker = f"interrupted-{uuid.uuid4().hex}"
    path = str(tmp_path / "lines")
    started = time.monotonic()
    run = wf.start("test.stuck", {"how": "query", "path": path, "marker": marker, "timeout": 1, "atomic": atomic})

    run = wait_for_terminal(run.id)

    # then the run went on at once on a usable connection, and PostgreSQL is no longer running the query
    assert run.status == RunStatus.COMPLETED, run.error
    assert (run.result, run.recovery_count) == ("second try", 0)
    assert StepResult.objects.get(run=run).tries == 2
    assert time.monotonic() - started < 10
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s AND pid <> pg_backend_pid()", [f"%{marker}%"]
        )
        assert cursor.fetchone() == (0,)


# --- a database connection lost inside a step (item 10) ------------------------------------------
def test_a_connection_lost_inside_a_step_is_the_workers_problem_not_the_runs(worker: Worker, tmp_path: Path) -> None:
    # given steps that each have the worker's PostgreSQL backend terminated on their first try:
    # the first then raises ValueError, the second returns, the third (the last) returns
    path = str(tmp_path / "lines")
    run = wf.start("test.cut_connection", {"path": path})

    run = wait_for_terminal(run.id)

    # then the first step's retry was scheduled and ran, the others' results were stored on a new
    # connection, and the run completed without recovery
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.result == ["raise", "return", "return last"]
    assert lines(path) == ["raise", "raise", "return", "return last"]
    steps = StepResult.objects.filter(run=run)
    assert [(s.status, s.tries) for s in steps] == [
        (StepStatus.COMPLETED, 2),
        (StepStatus.COMPLETED, 1),
        (StepStatus.COMPLETED, 1),
    ]
    assert run.recovery_count == 0


def test_progress_and_broadcasts_are_not_sent_again_when_a_resume_replays_them(worker: Worker) -> None:
    # given a run that reports its progress and broadcasts between steps, and rests after each
    from workflows.streams import events_after

    run = wf.start("test.progress_rests", {})

    # when it has rested three times (each resume replays run() from the top)
    assert wait_for_terminal(run.id).status == RunStatus.COMPLETED

    # then each report and broadcast reached its stream once, in order: a page's progress never goes back
    def sent() -> list[tuple[str, Any]] | None:
        events = [(e["type"], e["data"]) for e in events_after(run.id, 0) if e["type"] in ("progress", "broadcast")]
        return events if ("broadcast", {"done": 3}) in events else None

    events = wait_for(sent, what="the last broadcast")
    assert events == [(kind, {"done": i}) for i in (1, 2, 3) for kind in ("progress", "broadcast")]
    assert WorkflowRun.objects.get(pk=run.id).progress == {"done": 3}
