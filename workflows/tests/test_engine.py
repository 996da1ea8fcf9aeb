"""The engine end to end: runs started here, advanced by a real Celery worker on PostgreSQL."""
from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from tests.support import Worker, wait_for_status, wait_for_terminal
from tests.workflows_fixtures import lines
from workflows import public as wf
from workflows.models import RunStatus, StepResult, StepStatus

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
    assert run.result["reply"] == {"text": "yes"}
    assert run.events.count() == 1


def test_an_event_sent_before_the_wait_is_kept_for_it(worker: Worker) -> None:
    run = wf.start("test.wait", {"timeout": 60})
    wf.send_event(run, "reply", {"early": True})

    run = wait_for_terminal(run.id)

    assert run.result["reply"] == {"early": True}


def test_wait_for_event_times_out(worker: Worker) -> None:
    run = wf.start("test.wait", {"timeout": 1})

    run = wait_for_terminal(run.id, timeout=20)

    assert run.status == RunStatus.COMPLETED
    assert run.result == {"timed_out": True}
    wait = StepResult.objects.get(run=run, name="wait for reply")
    assert wait.status == StepStatus.FAILED and wait.error["type"] == "WaitTimeout"


def test_a_step_sent_to_another_queue_runs_there_once(worker: Worker, tmp_path: Path, settings) -> None:
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
    assert "the limit is 1,048,576 (WORKFLOWS_MAX_RESULT_BYTES)" in run.result["too_big"]
    assert "not JSON-serialisable" in run.result["not_json"]
    assert set(StepResult.objects.filter(run=run).values_list("status", "tries")) == {(StepStatus.FAILED, 1)}


def test_heartbeat_keeps_a_long_step_from_being_recovered(worker: Worker, tmp_path: Path, settings) -> None:
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


def test_a_run_of_a_workflow_that_no_longer_exists_fails_clearly(worker: Worker) -> None:
    from workflows.models import WorkflowRun

    run = wf.start("test.echo", {})
    WorkflowRun.objects.filter(pk=run.pk).update(workflow="gone.away")
    run = wait_for_terminal(run.id)

    assert run.status == RunStatus.FAILED
    assert run.failure_reason == "unknown_workflow"


def test_a_step_body_knows_its_run_and_step(worker: Worker) -> None:
    from workflows import current_step

    run = wf.start("test.context", {})

    run = wait_for_terminal(run.id)

    assert run.result == {"run": str(run.id), "attempt": 1, "step": "where am I"}
    assert current_step() is None  # outside a step body
