import pytest

from workflows import hooks
from workflows import public as wf
from workflows.models import RunStatus, WorkflowRun


@pytest.mark.django_db
def test_terminate_calls_the_registered_hooks_inside_its_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []
    monkeypatch.setattr(hooks, "_on_terminated", [])
    hooks.on_run_terminated(lambda run: seen.append((str(run.id), run.status)))
    run = wf.start("test.echo", {})

    wf.terminate(run)

    assert seen == [(str(run.id), RunStatus.TERMINATED)]


@pytest.mark.django_db
def test_a_failing_hook_rolls_the_termination_back(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(run: WorkflowRun) -> None:
        raise RuntimeError("no")

    monkeypatch.setattr(hooks, "_on_terminated", [refuse])
    run = wf.start("test.echo", {})

    with pytest.raises(RuntimeError):
        wf.terminate(run)

    assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.QUEUED
