"""``step.sleep_until``: a durable sleep until a time, advanced by a real Celery worker."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from tests.support import Worker, wait_for_status, wait_for_terminal
from tests.workflows_fixtures import lines
from workflows import public as wf
from workflows.models import RunStatus, StepResult, StepStatus, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_run_sleeps_until_the_time_and_resumes_after_it_without_sleeping_again(
    worker: Worker, tmp_path: Path
) -> None:
    # given a run that sleeps until a time a few seconds from now, then naps for a second (so
    # that it replays once more through the finished sleep)
    path = str(tmp_path / "lines")
    until = timezone.now() + timedelta(seconds=4)
    run = wf.start("test.sleep_until", {"path": path, "until": until.isoformat(), "nap": 1})

    # when it reaches the sleep
    run = wait_for_status(run.id, RunStatus.SLEEPING)

    # then it waits for exactly that time, the step after the sleep not run
    assert (run.wait_step, run.wake_at) == ("until", until)
    assert lines(path) == ["before"]
    # and it is still asleep, the step after still not run, half a second before the time
    time.sleep(max(0.0, (until - timezone.now()).total_seconds() - 0.5))
    assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.SLEEPING
    assert lines(path) == ["before"]

    # when the time has come
    run = wait_for_terminal(run.id)

    # then it resumed after the time; its replays answered the step before and the sleep from
    # storage: neither ran nor slept again, and nothing was added
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.result is not None and run.result["after"] >= until.timestamp() + 1
    assert lines(path) == ["before", "after"]
    steps = list(StepResult.objects.filter(run=run).order_by("position"))
    assert [(s.name, s.status, s.tries) for s in steps] == [
        ("before", StepStatus.COMPLETED, 1),
        ("until", StepStatus.COMPLETED, 0),
        ("nap", StepStatus.COMPLETED, 0),
        ("after", StepStatus.COMPLETED, 1),
    ]
    sleep, nap = steps[1], steps[2]
    assert sleep.wake_at == until
    assert sleep.finished_at is not None and nap.started_at is not None and nap.finished_at is not None
    assert until <= sleep.finished_at <= nap.started_at  # finished once, before the nap, not again after it
    assert run.finished_at is not None and run.finished_at - nap.finished_at < timedelta(seconds=5)


def test_a_time_already_past_does_not_suspend_the_run(worker: Worker, tmp_path: Path) -> None:
    # given a run told to sleep until a time that has passed
    path = str(tmp_path / "lines")
    until = timezone.now() - timedelta(hours=1)

    # when it runs
    run = wf.start("test.sleep_until", {"path": path, "until": until.isoformat()})
    run = wait_for_terminal(run.id)

    # then it carried on at once: the sleep is recorded as done, with no timer ever set
    assert run.status == RunStatus.COMPLETED, run.error
    assert lines(path) == ["before", "after"]
    sleep = StepResult.objects.get(run=run, name="until")
    assert (sleep.status, sleep.wake_at) == (StepStatus.COMPLETED, None)
    assert run.result is not None and run.result["after"] - run.result["before"] < 5
