"""WorkflowRun's transitions set the fields of the state they lead to, and the SQL that takes the
same transitions on the hot paths (statements.claim and finish, the sweeper's timers) writes the
same: each test takes a transition both ways, on two runs alike, and compares the rows."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from workflows import services, statements
from workflows.models import NO_WAIT, RunStatus, WorkflowRun
from workflows.sweeper import sweep

pytestmark = pytest.mark.django_db

NOW = timezone.now()
LEASE_UNTIL = NOW + timedelta(minutes=5)
WAITING = {"wake_at": NOW - timedelta(seconds=1), "wait_step": "nap", "wait_event_type": "reply"}
# A running run as a worker holds it; the wait fields set too, to see who clears them.
HELD = {"lease_owner": "w1", "lease_expires_at": LEASE_UNTIL, "current_step": "charge", "started_at": NOW, **WAITING}
# Not the transition's: the row's identity and its auto_now stamps.
OWN = {"id", "created_at", "updated_at"}


def a_run(status: str, **fields: Any) -> WorkflowRun:
    # The status is a protected FSM field: set once, at creation.
    return WorkflowRun.objects.create(workflow="test.echo", status=status, **fields)


def twins(status: str, **fields: Any) -> tuple[WorkflowRun, WorkflowRun]:
    return a_run(status, **fields), a_run(status, **fields)


def row(run: WorkflowRun, *, ignore: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The run as stored, but for what is not the transition's (and ``ignore``)."""
    stored = WorkflowRun.objects.get(pk=run.pk)
    return {f.attname: getattr(stored, f.attname) for f in WorkflowRun._meta.concrete_fields} | {
        name: None for name in OWN | ignore
    }


def test_the_claim_of_a_queued_run_is_begin() -> None:
    by_sql, by_model = twins(RunStatus.QUEUED)

    assert statements.claim(by_sql.id, "w1", NOW, LEASE_UNTIL) is not None
    by_model.begin(owner="w1", lease_until=LEASE_UNTIL, now=NOW)
    by_model.save()

    assert row(by_sql) == row(by_model)
    assert row(by_sql)["status"] == RunStatus.RUNNING


def test_the_claim_of_a_run_whose_worker_died_is_begin_with_one_recovery() -> None:
    gone = {**HELD, "lease_expires_at": NOW - timedelta(seconds=1)}
    by_sql, by_model = twins(RunStatus.RUNNING, **gone)

    assert statements.claim(by_sql.id, "w2", NOW, LEASE_UNTIL) is not None
    by_model.begin(owner="w2", lease_until=LEASE_UNTIL, now=NOW)
    by_model.save()

    assert row(by_sql) == row(by_model)
    assert (row(by_sql)["recovery_count"], row(by_sql)["lease_owner"]) == (1, "w2")


@pytest.mark.parametrize("status", [RunStatus.SLEEPING, RunStatus.RETRYING, RunStatus.WAITING])
def test_the_claim_of_a_due_timer_is_wake_then_begin(status: str) -> None:
    by_sql, by_model = twins(status, **WAITING)

    assert statements.claim(by_sql.id, "w1", NOW, LEASE_UNTIL) is not None
    by_model.wake(now=NOW)
    by_model.begin(owner="w1", lease_until=LEASE_UNTIL, now=NOW)
    by_model.save()

    # the claim skips the queue (the worker is already there): it is not enqueued again
    assert row(by_sql, ignore=frozenset({"enqueued_at"})) == row(by_model, ignore=frozenset({"enqueued_at"}))
    assert {name: row(by_sql)[name] for name in NO_WAIT} == NO_WAIT


@pytest.mark.parametrize("ends", ["complete", "fail"])
def test_finish_is_complete_or_fail(ends: str) -> None:
    by_sql, by_model = twins(RunStatus.RUNNING, **HELD)
    for run in (by_sql, by_model):
        if ends == "complete":
            run.complete(result={"ok": True}, now=NOW)
        else:
            run.fail(error={"type": "Boom", "message": "no"}, reason="error", now=NOW)

    finished, _ = statements.finish(run=by_sql, owner="w1", now=NOW, write=None)
    by_model.save()

    assert finished
    assert row(by_sql) == row(by_model)
    assert {name: row(by_sql)[name] for name in ("lease_owner", "current_step", *NO_WAIT)} == {
        "lease_owner": "",
        "current_step": "",
        **NO_WAIT,
    }


@pytest.mark.parametrize("status", [RunStatus.SLEEPING, RunStatus.RETRYING, RunStatus.WAITING])
def test_the_sweepers_timer_is_wake(status: str) -> None:
    by_sql = a_run(status, **WAITING)
    assert sweep(now=NOW).timers_fired == 1  # before the other run exists, which it would wake too
    by_model = a_run(status, **WAITING)

    by_model.wake(now=NOW)
    by_model.save()

    assert row(by_sql) == row(by_model)
    assert row(by_sql)["status"] == RunStatus.QUEUED


def test_a_run_paused_between_steps_asks_for_no_pause_any_more() -> None:
    # given a run its worker handed back to the queue while a pause was asked for (hand_back keeps
    # the request, so the next worker would pause it at its first step boundary)
    run = a_run(RunStatus.QUEUED, pause_requested=True)

    # when a person pauses it before a worker takes it
    services.run_pause(run_id=run.pk)

    # then it is paused, and no pause is pending for when it is resumed
    stored = WorkflowRun.objects.get(pk=run.pk)
    assert (stored.status, stored.pause_requested) == (RunStatus.PAUSED, False)
    services.run_resume(run_id=run.pk)
    assert WorkflowRun.objects.get(pk=run.pk).pause_requested is False
