"""``workflows.fsm.FSMModelMixin``: refreshing a protected state field is safe in threads, and
otherwise what Django's ``refresh_from_db`` is."""

from __future__ import annotations

import pytest

from tests.fixtures import NoEnqueue
from tests.support import thread_of
from workflows import services
from workflows.models import RunStatus, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)


def test_threads_refreshing_at_once_never_refuse_each_others_state(no_enqueue: NoEnqueue) -> None:
    # given runs whose status changed behind the instances that threads hold
    runs = [services.run_start(workflow="test.echo", payload={})[0] for _ in range(4)]
    WorkflowRun.objects.update(status=RunStatus.PAUSED)
    errors: list[BaseException] = []

    def refresh_often(run: WorkflowRun) -> None:
        try:
            for _ in range(150):
                run.refresh_from_db()
                assert run.status == RunStatus.PAUSED
        except BaseException as exc:  # noqa: BLE001  # reported below
            errors.append(exc)

    # when four threads refresh at once (as an ASGI server's thread pool does)
    threads = [thread_of(refresh_often, run) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # then none was refused (django-fsm's own mixin switches the field's protection off and on for
    # every thread at once: "Direct status modification is not allowed")
    assert errors == []


def test_a_refresh_reloads_the_state_and_still_protects_it(no_enqueue: NoEnqueue) -> None:
    run, _ = services.run_start(workflow="test.echo", payload={})
    attempt = run.attempt
    WorkflowRun.objects.filter(pk=run.pk).update(status=RunStatus.PAUSED, attempt=7)

    run.refresh_from_db(fields=["status"])
    assert (run.status, run.attempt) == (RunStatus.PAUSED, attempt)  # only what was asked for
    run.refresh_from_db()
    assert run.attempt == 7

    deferred = WorkflowRun.objects.defer("payload").get(pk=run.pk)
    deferred.refresh_from_db()
    assert "payload" in deferred.get_deferred_fields()  # still deferred, as Django leaves it
    assert deferred.status == RunStatus.PAUSED
    with pytest.raises(AttributeError, match="Direct status modification is not allowed"):
        deferred.status = RunStatus.RUNNING
