"""The runs' reads, called directly: which runs a caller gets, a run's attempts and events, and
what a suspended run waits for, in words for a page and for a terminal.

Runs are set up in the database directly (any state, as a fixture); nothing is enqueued.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import uuid4

import pytest
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone
from pytest_django import DjangoAssertNumQueries

from tests.factories import Users, make_restarted_wait, make_run
from workflows.models import RunAttempt, RunEvent, RunStatus, WorkflowRun
from workflows.selectors import (
    attempt_status,
    describe_wait,
    run_attempts,
    run_events,
    run_get_any,
    run_list,
    run_list_all,
    run_timeline,
    waiting_event_types,
)

pytestmark = pytest.mark.django_db

WAKE_AT = timezone.make_aware(datetime(2030, 1, 1, 12, 0, 0))


def suspended(status: str, *, event_type: str = "", wake_at: datetime | None = WAKE_AT) -> WorkflowRun:
    """An unsaved run suspended in ``status`` at the step "nap"."""
    return WorkflowRun(status=status, wait_step="nap", wait_event_type=event_type, wake_at=wake_at)


# --- which runs ------------------------------------------------------------------------------------
def test_run_list_all_is_every_run_newest_first_by_status_and_workflow(users: Users) -> None:
    # given
    older = make_run(status=RunStatus.QUEUED, owner=users.alice)
    newer = make_run(workflow="test.wait", status=RunStatus.WAITING, owner=users.mallory)
    nobodys = make_run(status=RunStatus.COMPLETED)

    # then
    assert list(run_list_all()) == [nobodys, newer, older]
    assert list(run_list_all(status=RunStatus.WAITING)) == [newer]
    assert list(run_list_all(workflow="test.echo")) == [nobodys, older]
    assert list(run_list_all(status=RunStatus.COMPLETED, workflow="test.wait")) == []


def test_run_list_is_the_users_own_runs_or_all_for_staff_who_may_view_them(users: Users) -> None:
    # given
    alices = make_run(status=RunStatus.QUEUED, owner=users.alice)
    mallorys = make_run(owner=users.mallory, status=RunStatus.COMPLETED)

    # then
    assert set(run_list(user=users.alice)) == {alices}
    assert set(run_list(user=users.carol)) == {alices, mallorys}  # staff with view_workflowrun
    assert set(run_list(user=users.carol, status=RunStatus.COMPLETED)) == {mallorys}
    assert not run_list(user=AnonymousUser()).exists()


def test_run_get_any_finds_any_run_with_its_owner(
    users: Users, django_assert_num_queries: DjangoAssertNumQueries
) -> None:
    run = make_run(status=RunStatus.QUEUED, owner=users.mallory)

    with django_assert_num_queries(1):  # the owner comes with the run
        found = run_get_any(run_id=run.pk)
        assert found == run and found.owner == users.mallory

    assert run_get_any(run_id=uuid4()) is None


def test_a_runs_attempts_and_events_in_order() -> None:
    # given
    run, other = make_run(status=RunStatus.QUEUED, attempt=2), make_run(status=RunStatus.QUEUED)
    second = RunAttempt.objects.get(run=run, number=2)  # make_run writes the current attempt
    first = RunAttempt.objects.create(run=run, number=1, status=RunStatus.TERMINATED, finished_at=timezone.now())
    early = RunEvent.objects.create(run=run, type="reply")
    late = RunEvent.objects.create(run=run, type="reply", created_at=early.created_at + timedelta(seconds=1))
    RunEvent.objects.create(run=other, type="reply")

    # then
    assert list(run_attempts(run=run)) == [first, second]
    assert list(run_events(run=run)) == [early, late]


def test_attempt_status_is_the_runs_while_the_attempt_is_current() -> None:
    run = make_run(status=RunStatus.WAITING, attempt=2)
    ended = RunAttempt(run=run, number=1, status=RunStatus.TERMINATED, finished_at=timezone.now())
    current = RunAttempt(run=run, number=2, status=RunStatus.QUEUED)  # the stored status, not updated yet

    assert attempt_status(run, ended) == RunStatus.TERMINATED
    assert attempt_status(run, current) == RunStatus.WAITING


def test_a_steps_timer_shows_only_while_it_can_fire() -> None:
    # a run restarted while attempt 1 waited, now waiting again on attempt 2
    run = make_restarted_wait(wake_at=WAKE_AT)

    # the current attempt's wait has its time; the attempt restarted away from has none
    assert [(s["attempt"], s["status"], s["wake_at"]) for s in run_timeline(run=run)] == [
        (1, "waiting", None),
        (2, "waiting", WAKE_AT.isoformat()),
    ]

    # once the run ended, nothing wakes either: each keeps the status it stopped in, without a time
    WorkflowRun.objects.filter(pk=run.pk).update(status=RunStatus.TERMINATED, finished_at=timezone.now())
    run.refresh_from_db()
    assert [(s["attempt"], s["status"], s["wake_at"]) for s in run_timeline(run=run)] == [
        (1, "waiting", None),
        (2, "waiting", None),
    ]


def test_waiting_event_types_are_those_waiting_runs_wait_for_each_once() -> None:
    make_run(workflow="test.wait", status=RunStatus.WAITING, wait_event_type="reply")
    make_run(workflow="test.wait", status=RunStatus.WAITING, wait_event_type="approve")
    make_run(workflow="test.wait", status=RunStatus.WAITING, wait_event_type="reply")
    make_run(workflow="test.wait", status=RunStatus.WAITING)  # a step's deadline: no event
    make_run(workflow="test.wait", status=RunStatus.QUEUED, wait_event_type="stale")  # woken: not waiting any more

    assert waiting_event_types() == ["approve", "reply"]


# --- what a suspended run waits for --------------------------------------------------------------
@pytest.mark.parametrize(
    "run, page, plain",
    [
        (suspended(RunStatus.WAITING, event_type="reply"), "event “reply”", "event 'reply'"),
        (suspended(RunStatus.SLEEPING), "sleep “nap”", "sleep 'nap'"),
        (suspended(RunStatus.RETRYING), "retry of “nap”", "retry of 'nap'"),
        (suspended(RunStatus.WAITING), "step “nap”", "step 'nap'"),  # a step's deadline
    ],
)
def test_describe_wait_names_what_the_run_waits_for(run: WorkflowRun, page: str, plain: str) -> None:
    until = timezone.localtime(WAKE_AT).strftime("%Y-%m-%d %H:%M:%S")
    now = WAKE_AT - timedelta(minutes=5)

    assert describe_wait(run, now=now) == f"{page} until {until} (in 5\xa0minutes)"
    assert describe_wait(run, plain=True, now=now) == f"{plain} until {until}"


def test_describe_wait_says_overdue_without_a_time_or_nothing() -> None:
    late = suspended(RunStatus.SLEEPING)
    no_time = suspended(RunStatus.WAITING, event_type="reply", wake_at=None)
    woken = suspended(RunStatus.QUEUED, event_type="reply")  # its wait fields outlive the wait

    assert describe_wait(late, now=WAKE_AT).endswith(" (overdue)")
    assert describe_wait(no_time) == "event “reply”"
    assert describe_wait(no_time, plain=True) == "event 'reply'"
    assert describe_wait(woken) == describe_wait(woken, plain=True) == ""


def test_describe_wait_shows_a_terminal_control_characters_escaped() -> None:
    run = suspended(RunStatus.WAITING, event_type="re\nply\x1b[2J", wake_at=None)

    assert describe_wait(run, plain=True) == "event 're\\nply\\x1b[2J'"
