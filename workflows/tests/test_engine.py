"""The engine end to end: runs started here, advanced by a real Celery worker on PostgreSQL."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

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
