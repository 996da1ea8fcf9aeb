"""Ticks at the same moment, on real PostgreSQL connections in threads released by a barrier:
each due time fires once. Each of the two guarantees is raced on its own: the row lock (ticks
racing) and the unique firing row with the idempotency key (firings racing without the lock)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from schedules.models import Outcome, Schedule, ScheduleFiring, Trigger
from schedules.services import TickReport, fire_locked, schedules_tick
from schedules.tests.support import workflow_schedule
from tests.fixtures import NoEnqueue
from tests.support import race
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)
# Due an hour from now, and ticked as if it were then: the session's own beat (the shared worker
# fixture ticks the schedules of the test database too) never finds these due first.
LATER = timedelta(hours=1)


def test_four_ticks_racing_fire_each_due_schedule_once(no_enqueue: NoEnqueue) -> None:
    # given
    now = timezone.now() + LATER
    due = now - timedelta(seconds=1)
    schedules = [workflow_schedule(f"race-{i}", due=due) for i in range(3)]

    # when
    reports = race(lambda: schedules_tick(now=now), n=4)

    # then
    assert all(isinstance(r, TickReport) for r in reports), reports
    assert sum(len(r.fired) for r in reports) == 3
    for schedule in schedules:
        [firing] = ScheduleFiring.objects.filter(schedule=schedule)
        assert firing.due_at == due and firing.outcome == Outcome.STARTED
        assert WorkflowRun.objects.filter(idempotency_key=firing.idempotency_key).count() == 1
        schedule.refresh_from_db()
        assert schedule.next_due_at == due + timedelta(seconds=60)


def test_two_firings_of_one_due_time_without_the_row_lock_start_one_run(no_enqueue: NoEnqueue) -> None:
    """As if the lock were lost (a bug, a hand-made tick): the firing row's unique index makes the
    second insert wait for the first transaction, then fail; its work never starts."""
    now = timezone.now() + LATER
    schedule = workflow_schedule(due=now)

    def fire() -> ScheduleFiring | None:
        with transaction.atomic():
            unlocked = Schedule.objects.get(pk=schedule.pk)
            return fire_locked(unlocked, due_at=now, trigger=Trigger.SCHEDULE, now=now)

    results = race(fire, n=2)

    assert sorted(r is None for r in results) == [False, True], results
    [firing] = ScheduleFiring.objects.filter(schedule=schedule)
    assert WorkflowRun.objects.filter(idempotency_key=firing.idempotency_key).count() == 1
    assert WorkflowRun.objects.filter(idempotency_key__startswith="schedule:").count() == 1
