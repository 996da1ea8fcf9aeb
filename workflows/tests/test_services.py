"""Starting and controlling runs: idempotency, each control, each refused transition."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.factories import Users
from tests.fixtures import NoEnqueue
from tests.support import Worker, race, wait_for, wait_for_status, wait_for_terminal
from tests.workflows_fixtures import lines
from workflows import public as wf
from workflows.exceptions import (
    IdempotencyConflict,
    InvalidPayload,
    TooManyRuns,
    TransitionNotAllowed,
    UnknownWorkflow,
)
from workflows.models import RunAttempt, RunEvent, RunStatus, StepResult, WorkflowRun
from workflows.services import run_start


@pytest.mark.django_db
class TestStart:
    def test_same_key_same_payload_returns_the_run(self) -> None:
        first = wf.start("test.echo", {"a": 1}, idempotency_key="k1")
        again = wf.start("test.echo", {"a": 1}, idempotency_key="k1")
        assert again.id == first.id
        assert WorkflowRun.objects.count() == 1

    def test_same_key_other_payload_is_a_conflict_and_creates_nothing(self) -> None:
        wf.start("test.echo", {"a": 1}, idempotency_key="k1")
        with pytest.raises(IdempotencyConflict, match="k1"):
            wf.start("test.echo", {"a": 2}, idempotency_key="k1")
        assert WorkflowRun.objects.count() == 1

    def test_keys_of_different_owners_do_not_collide(self, users: Users) -> None:
        a = wf.start("test.echo", {"a": 1}, idempotency_key="k", owner=users.alice)
        m = wf.start("test.echo", {"a": 2}, idempotency_key="k", owner=users.mallory)
        assert a.id != m.id

    def test_start_records_the_first_attempt(self) -> None:
        run = wf.start("test.echo", {})
        assert run.status == RunStatus.QUEUED
        assert list(RunAttempt.objects.filter(run=run).values_list("number", flat=True)) == [1]

    def test_unknown_workflow_and_bad_payloads_are_refused(self) -> None:
        with pytest.raises(UnknownWorkflow):
            wf.start("no.such", {})
        with pytest.raises(InvalidPayload, match="JSON object"):
            wf.start("test.echo", [1, 2])  # type: ignore[arg-type]
        with pytest.raises(InvalidPayload, match="limit"):
            wf.start("test.echo", {"x": "y" * 300_000})
        assert WorkflowRun.objects.count() == 0


def _run_in(status: str) -> WorkflowRun:
    run = wf.start("test.echo", {})
    WorkflowRun.objects.filter(pk=run.pk).update(status=status)
    return WorkflowRun.objects.get(pk=run.pk)


@pytest.mark.django_db
class TestRefusedTransitions:
    @pytest.mark.parametrize("status", ["completed", "failed", "terminated", "paused"])
    def test_pause(self, status: str) -> None:
        run = _run_in(status)
        with pytest.raises(TransitionNotAllowed) as refused:
            wf.pause(run)
        assert refused.value.status == status
        assert WorkflowRun.objects.get(pk=run.pk).status == status

    @pytest.mark.parametrize("status", ["queued", "sleeping", "completed", "failed", "terminated"])
    def test_resume(self, status: str) -> None:
        run = _run_in(status)
        with pytest.raises(TransitionNotAllowed, match=f"is {status}"):
            wf.resume(run)
        assert WorkflowRun.objects.get(pk=run.pk).status == status

    @pytest.mark.parametrize("status", ["completed", "failed", "terminated"])
    def test_terminate(self, status: str) -> None:
        run = _run_in(status)
        with pytest.raises(TransitionNotAllowed):
            wf.terminate(run)
        assert WorkflowRun.objects.get(pk=run.pk).status == status

    @pytest.mark.parametrize("status", ["completed", "failed", "terminated"])
    def test_event_to_a_finished_run(self, status: str) -> None:
        run = _run_in(status)
        with pytest.raises(TransitionNotAllowed):
            wf.send_event(run, "reply", {})
        assert RunEvent.objects.count() == 0

    def test_event_key_reused_with_another_payload(self) -> None:
        run = wf.start("test.echo", {})
        wf.send_event(run, "reply", {"a": 1}, idempotency_key="e")
        with pytest.raises(IdempotencyConflict):
            wf.send_event(run, "reply", {"a": 2}, idempotency_key="e")
        assert RunEvent.objects.count() == 1


@pytest.mark.django_db(transaction=True)
class TestControls:
    def test_pause_takes_effect_at_the_next_step_boundary(self, worker: Worker, tmp_path: Path) -> None:
        # given a run whose step 1 is slow
        path = str(tmp_path / "lines")
        run = wf.start("test.lines", {"path": path, "steps": 4, "slow_step": 1, "slow_seconds": 1.5})
        wait_for(lambda: lines(path) == ["0", "1"], what="step 1 to start")

        # when it is paused mid-step
        run = wf.pause(run)
        assert run.status == RunStatus.RUNNING and run.pause_requested

        # then step 1 finishes, step 2 never starts, and the run is paused
        run = wait_for_status(run.id, RunStatus.PAUSED)
        assert lines(path) == ["0", "1"]
        assert StepResult.objects.filter(run=run).count() == 2

        # and resume carries on from step 2
        wf.resume(run)
        run = wait_for_terminal(run.id)
        assert run.status == RunStatus.COMPLETED
        assert lines(path) == ["0", "1", "2", "3"]

    def test_pause_a_sleeping_run_then_resume(self, worker: Worker) -> None:
        run = wf.start("test.sleep", {"seconds": 1})
        wait_for_status(run.id, RunStatus.SLEEPING)

        wf.pause(run)
        assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.PAUSED
        time.sleep(1.5)  # the timer passes while paused: it must not fire
        assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.PAUSED

        wf.resume(run)
        assert wait_for_terminal(run.id).status == RunStatus.COMPLETED

    def test_terminate_stops_future_steps(self, worker: Worker, tmp_path: Path) -> None:
        path = str(tmp_path / "lines")
        run = wf.start("test.lines", {"path": path, "steps": 4, "slow_step": 1, "slow_seconds": 1.5})
        wait_for(lambda: lines(path) == ["0", "1"], what="step 1 to start")

        wf.terminate(run)

        time.sleep(3)
        run = WorkflowRun.objects.get(pk=run.pk)
        assert run.status == RunStatus.TERMINATED
        assert lines(path) == ["0", "1"]
        assert run.finished_at is not None

    def test_restart_runs_a_new_attempt_and_keeps_the_old_one(self, worker: Worker, tmp_path: Path) -> None:
        # given a run that failed
        path = str(tmp_path / "tries")
        run = wf.start("test.flaky", {"path": path, "fail_times": 1, "limit": 0})
        run = wait_for_terminal(run.id)
        assert run.status == RunStatus.FAILED

        # when it is restarted (the step now succeeds on its second try overall)
        wf.restart(run)
        run = wait_for_terminal(run.id)

        # then attempt 2 completed and attempt 1 is still there, failed
        assert (run.status, run.attempt, run.result) == (RunStatus.COMPLETED, 2, "ok")
        attempts = {a.number: a for a in RunAttempt.objects.filter(run=run)}
        assert attempts[1].error is not None
        assert attempts[1].status == RunStatus.FAILED and attempts[1].error["type"] == "ValueError"
        assert attempts[2].status == RunStatus.COMPLETED
        steps = list(StepResult.objects.filter(run=run).values_list("attempt", "status"))
        assert steps == [(1, "failed"), (2, "completed")]


@pytest.mark.django_db(transaction=True)
def test_starts_with_one_key_at_the_same_instant_make_one_run(no_enqueue: NoEnqueue) -> None:
    # when eight threads start the same run with one key at once
    started = race(lambda: wf.start("test.echo", {"a": 1}, idempotency_key="together").id, 8)

    # then one run was made, with one attempt, and every start answers with it
    [run] = WorkflowRun.objects.all()
    assert started == [run.id] * 8
    assert list(RunAttempt.objects.values_list("run_id", "number")) == [(run.id, 1)]


@pytest.mark.django_db(transaction=True)
def test_starts_with_one_key_sent_together_at_the_quota_all_get_its_run(
    users: Users, settings: Any, no_enqueue: NoEnqueue
) -> None:
    # given alice one run short of her quota (no worker takes the runs: they stay unfinished)
    settings.WORKFLOWS = {**settings.WORKFLOWS, "MAX_ACTIVE_RUNS_PER_OWNER": 2}
    run_start(workflow="test.echo", payload={"a": 0}, owner=users.alice, quota=True)

    # when eight starts of one run with one key come at once
    def start() -> Any:
        return run_start(workflow="test.echo", payload={"a": 1}, idempotency_key="k", owner=users.alice, quota=True)

    started = [result[0].id if isinstance(result, tuple) else result for result in race(start, 8)]

    # then one of them made the run, and the others, past the quota once it was made, get it too
    run = WorkflowRun.objects.get(idempotency_key="k")
    assert started == [run.id] * 8
    assert WorkflowRun.objects.filter(owner=users.alice).count() == 2
    # and a new key past the quota is still refused
    with pytest.raises(TooManyRuns):
        run_start(workflow="test.echo", payload={"a": 2}, idempotency_key="other", owner=users.alice, quota=True)
