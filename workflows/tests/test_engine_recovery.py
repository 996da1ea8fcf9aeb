"""Faults for real: worker process groups are SIGKILLed mid-step, enqueues are lost, a step kills
its own worker every time. Each test has its own queue and its own workers, apart from the
session's shared worker."""
from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import Group

from tests.support import Worker, wait_for, wait_for_terminal
from tests.workflows_fixtures import lines
from workflows import public as wf
from workflows import services
from workflows.models import RunStatus, StepResult, StepStatus, WorkflowRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def queue(settings) -> Iterator[str]:
    """A queue only this test's workers listen on."""
    name = f"recovery-{uuid.uuid4().hex[:8]}"
    settings.WORKFLOWS = {**settings.WORKFLOWS, "QUEUE": name}
    yield name


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for w in started:
        w.stop()


def test_killed_worker_mid_step_loses_nothing_and_repeats_nothing(
    queue: str, workers: list[Worker], tmp_path: Path
) -> None:
    # given a run of 6 steps whose step 3 is slow, on a worker with beat (the sweeper)
    path = str(tmp_path / "lines")
    workers.append(Worker(queue=queue, beat=True))
    run = wf.start("test.lines", {"path": path, "steps": 6, "slow_step": 3, "slow_seconds": 3})
    wait_for(lambda: "3" in lines(path), what="step 3 to start")

    # when the worker's whole process group is SIGKILLed while step 3 runs
    workers[0].kill()
    assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.RUNNING

    # and a new worker starts
    workers.append(Worker(queue=queue, beat=True))
    run = wait_for_terminal(run.id, timeout=60)

    # then the run completes; steps before 3 ran once, step 3 at most twice, none after twice
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.result == [0, 1, 2, 3, 4, 5]
    counts = Counter(lines(path))
    assert [counts[str(i)] for i in range(3)] == [1, 1, 1]
    assert 1 <= counts["3"] <= 2
    assert [counts[str(i)] for i in range(4, 6)] == [1, 1]
    assert run.recovery_count == 1
    assert StepResult.objects.filter(run=run).count() == 6


def test_a_lost_enqueue_is_recovered_by_the_sweeper(
    queue: str, workers: list[Worker], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a run committed without its Celery message (a crash between commit and send)
    path = str(tmp_path / "lines")
    monkeypatch.setattr(services, "enqueue_run", lambda run_id, **kw: None)
    run = wf.start("test.lines", {"path": path, "steps": 2})
    monkeypatch.undo()
    workers.append(Worker(queue=queue, beat=False))
    assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.QUEUED

    # when the sweeper runs after the enqueue grace period (this one, or the beat of another
    # test's worker: both re-enqueue to the run's own queue, where nothing else would send it)
    from workflows.sweeper import sweep

    def swept() -> bool:
        sweep()
        return WorkflowRun.objects.get(pk=run.pk).status != RunStatus.QUEUED

    wait_for(swept, timeout=15, interval=0.2, what="the sweeper to requeue the run")

    # then the run is enqueued again and completes
    run = wait_for_terminal(run.id)
    assert run.status == RunStatus.COMPLETED
    assert lines(path) == ["0", "1"]


def test_a_step_that_kills_its_worker_every_time_fails_the_run(
    queue: str, workers: list[Worker], tmp_path: Path
) -> None:
    # given a worker that allows two recoveries
    path = str(tmp_path / "kills")
    workers.append(Worker(queue=queue, beat=True, WORKFLOWS_MAX_RECOVERY_ATTEMPTS="2"))

    # when a step SIGKILLs its own worker process on every try
    run = wf.start("test.poison", {"path": path})
    run = wait_for_terminal(run.id, timeout=90)

    # then the run stops as failed with reason max_recovery_attempts, no endless loop
    assert run.status == RunStatus.FAILED
    assert run.failure_reason == "max_recovery_attempts"
    assert lines(path) == ["kill"] * 3  # the first try and two recoveries
    assert not StepResult.objects.filter(run=run, status=StepStatus.COMPLETED).exists()


def test_atomic_step_killed_inside_its_body_leaves_nothing_then_happens_once(
    queue: str, workers: list[Worker], tmp_path: Path
) -> None:
    # given an atomic step that has written its row and is still inside its body
    path = str(tmp_path / "atomic")
    workers.append(Worker(queue=queue, beat=True))
    run = wf.start("test.atomic", {"group": "exactly-once", "path": path, "hold": 3})
    wait_for(lambda: lines(path) == ["inside"], what="the body to be inside its transaction")

    # when the worker is killed
    workers[0].kill()

    # then neither the body's row nor the step result exists
    assert not Group.objects.filter(name="exactly-once").exists()
    assert not StepResult.objects.filter(run=run).exists()

    # and after recovery both exist, once
    workers.append(Worker(queue=queue, beat=True))
    run = wait_for_terminal(run.id, timeout=60)
    assert run.status == RunStatus.COMPLETED, run.error
    assert Group.objects.filter(name="exactly-once").count() == 1
    assert run.result == Group.objects.get(name="exactly-once").pk
    assert StepResult.objects.filter(run=run).count() == 1
    assert lines(path) == ["inside", "inside"]
