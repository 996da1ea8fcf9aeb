"""Steps sent to another queue: each try's message runs its body at most once, and a message of
an earlier try runs nothing. The run is advanced here, in process, on a queue no worker listens
on; the step's task is then called as a worker would call it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings
from django.utils import timezone

from tests.support import race
from tests.workflows_fixtures import lines
from workflows import dispatch, engine
from workflows import public as wf
from workflows.models import RunStatus, StepResult, StepStatus, WorkflowRun
from workflows.sweeper import sweep
from workflows.tasks import run_step

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queue(settings: Any) -> Iterator[str]:
    """Queues nobody consumes: the run's, and the one its step is sent to."""
    name = f"dispatch-{uuid.uuid4().hex[:8]}"
    settings.WORKFLOWS = {**settings.WORKFLOWS, "QUEUE": name}
    yield name
    redis.Redis.from_url(django_settings.REDIS_URL).delete(name, f"{name}-io")


def dispatched(path: str, queue: str) -> tuple[WorkflowRun, StepResult]:
    """A run waiting for its second step, sent to ``queue``-io as try 1."""
    run = wf.start("test.dispatch", {"path": path, "queue": f"{queue}-io"})
    assert engine.advance(run.id) == "suspended"
    step = StepResult.objects.get(run=run, name="elsewhere")
    assert (step.status, step.tries) == (StepStatus.RUNNING, 1)
    return run, step


def time_passes(run: WorkflowRun, step: StepResult) -> None:
    """The run's timer and its step's fall due, and the sweeper fires them."""
    past = timezone.now() - timedelta(seconds=1)
    StepResult.objects.filter(pk=step.pk).update(wake_at=past)
    WorkflowRun.objects.filter(pk=run.pk).update(wake_at=past)
    sweep()


def test_two_deliveries_of_one_try_run_its_body_once(queue: str, tmp_path: Path) -> None:
    # given a step sent to another queue
    path = str(tmp_path / "lines")
    run, step = dispatched(path, queue)

    # when its message is delivered twice at once (a broker redelivery, a duplicate send)
    outcomes = race(lambda: dispatch.run_dispatched_step(run_id=run.id, attempt=1, position=step.position, tries=1))

    # then one delivery ran the body, the other refused, and the run is woken once
    assert sorted(outcomes) == ["completed", "duplicate"]
    assert lines(path) == ["0", "1"]
    step.refresh_from_db()
    assert (step.status, step.tries, step.result) == (StepStatus.COMPLETED, 1, 1)
    assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.QUEUED


def test_a_message_of_another_try_runs_nothing(queue: str, tmp_path: Path) -> None:
    # given a step sent to another queue as try 1
    path = str(tmp_path / "lines")
    run, step = dispatched(path, queue)

    # when a message naming another try arrives (a late one of an earlier try, say)
    outcomes = [
        dispatch.run_dispatched_step(run_id=run.id, attempt=1, position=step.position, tries=tries) for tries in (0, 2)
    ]

    # then it is refused and nothing changed
    assert outcomes == ["stale", "stale"]
    assert lines(path) == ["0"]
    step.refresh_from_db()
    assert (step.status, step.tries, step.result) == (StepStatus.RUNNING, 1, None)
    assert step.call is not None
    assert "claimed_at" not in step.call
    assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.WAITING


def test_a_message_of_a_try_the_run_gave_up_on_runs_nothing(queue: str, tmp_path: Path) -> None:
    # given a step whose try 1 did not report back in time, so the run sent try 2
    path = str(tmp_path / "lines")
    run, step = dispatched(path, queue)
    time_passes(run, step)
    assert engine.advance(run.id) == "suspended"  # try 1 timed out: its retry is scheduled
    time_passes(run, step)
    assert engine.advance(run.id) == "suspended"  # try 2 sent
    step.refresh_from_db()
    assert (step.status, step.tries) == (StepStatus.RUNNING, 2)

    # when try 1's message arrives late
    outcome = run_step(str(run.id), 1, step.position, 1)

    # then it runs nothing; try 2's message runs the body
    assert outcome == "stale"
    assert lines(path) == ["0"]
    assert run_step(str(run.id), 1, step.position, 2) == "completed"
    assert lines(path) == ["0", "1"]


def test_a_message_queued_before_messages_named_their_try_still_runs_once(queue: str, tmp_path: Path) -> None:
    # given a step sent to another queue
    path = str(tmp_path / "lines")
    run, step = dispatched(path, queue)

    # when the old three-argument message arrives, twice
    outcomes = [run_step(str(run.id), 1, step.position) for _ in range(2)]

    # then it runs the step's current try, once
    assert outcomes == ["completed", "gone"]
    assert lines(path) == ["0", "1"]
    step.refresh_from_db()
    assert (step.status, step.result) == (StepStatus.COMPLETED, 1)
