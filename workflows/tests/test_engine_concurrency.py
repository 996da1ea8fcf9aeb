"""Two workers advancing the same run at once, as real threads against PostgreSQL."""

from __future__ import annotations

import threading
from collections import Counter
from functools import partial
from pathlib import Path

import pytest

from tests.fixtures import NoEnqueue
from tests.support import race
from tests.workflows_fixtures import lines
from workflows import engine, step_store
from workflows import public as wf
from workflows.models import RunStatus, StepKind, StepResult, StepStatus, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_workers_on_one_run_run_each_step_once(tmp_path: Path, no_enqueue: NoEnqueue) -> None:
    # no_enqueue: only the threads advance
    for i in range(10):
        path = str(tmp_path / f"lines-{i}")
        run = wf.start("test.lines", {"path": path, "steps": 5})

        outcomes = race(partial(engine.advance, run.id))

        assert sorted(outcomes) == ["completed", "not_claimed"]
        assert Counter(lines(path)) == {str(s): 1 for s in range(5)}
        assert StepResult.objects.filter(run=run).count() == 5
        assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.COMPLETED


def test_the_loser_of_a_store_race_adopts_the_winners_result(no_enqueue: NoEnqueue) -> None:
    # no_enqueue: no worker stores it first
    run = wf.start("test.echo", {})

    def write(result_json: str) -> step_store.StepWrite:
        return step_store.StepWrite(
            run_id=run.id,
            attempt=1,
            position=1,
            name="echo",
            kind=StepKind.DO,
            status=StepStatus.COMPLETED,
            result_json=result_json,
            tries=1,
        )

    written = race(lambda: step_store.store(write(f'"{threading.get_ident()}"')), n=4)
    assert sorted(written) == [False, False, False, True]
    rows = StepResult.objects.filter(run=run)
    assert rows.count() == 1
    # a final row is never overwritten by a later writer
    assert not step_store.store(write('"late"'))
    assert rows.get().result != "late"
