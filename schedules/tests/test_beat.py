"""Two real Celery beat processes at once, each in its own worker process, both sending
``schedules.tick`` five times a second for a schedule due every second: each due time fires once,
and each firing's run is started once and completes."""

from __future__ import annotations

import shelve
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from schedules.models import Outcome, ScheduleFiring
from schedules.services import schedule_save, schedules_enable
from schedules.tests.support import workflow_schedule
from tests.support import Worker, wait_for
from workflows.models import RunStatus, WorkflowRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
SECONDS = 3


def test_two_beats_at_once_fire_each_due_time_once(queue: str, workers: list[Worker]) -> None:
    # given: two worker processes, each with its own beat (-B), started together
    def start(_: int) -> Worker:
        return Worker(queue=queue, concurrency=1, beat=True, SCHEDULES_TICK_INTERVAL="0.2")

    with ThreadPoolExecutor(max_workers=2) as pool:
        workers.extend(pool.map(start, range(2)))
    schedule = workflow_schedule("beat-race", due=None, every=1)
    schedule_save(schedule=schedule, changed=["interval_seconds"])  # due one second from now
    anchor = schedule.next_due_at
    assert anchor is not None

    # when: a few seconds of both beats ticking, then the schedule is switched off
    time.sleep(SECONDS + 0.5)
    schedules_enable(schedules=[schedule], enabled=False)
    runs = WorkflowRun.objects.filter(idempotency_key__startswith="schedule:beat-race:")
    wait_for(  # the work happened: the workers advanced every run started
        lambda: not runs.exclude(status=RunStatus.COMPLETED).exists(), timeout=15, what="the runs to complete"
    )
    for worker in workers:
        worker.stop()

    # then: one firing per due time, on the schedule's one-second grid, each with its own run
    firings = list(ScheduleFiring.objects.filter(schedule=schedule).order_by("due_at"))
    assert len(firings) >= SECONDS - 1, [f.due_at for f in firings]
    offsets = [(f.due_at - anchor) / timedelta(seconds=1) for f in firings]
    assert all(o == int(o) and o >= 0 for o in offsets), offsets
    assert all(f.outcome == Outcome.STARTED and f.run_id for f in firings), [(f.outcome, f.error) for f in firings]
    assert sorted(str(r.pk) for r in runs) == sorted(str(f.run_id) for f in firings)
    # Both beats really sent ticks, so the two processes did race: each one's own schedule file
    # counts what it sent. Its log, at INFO, does not: config/celery.py leaves beat's line out for
    # entries due this often (here five times a second), while beat's other lines stay.
    for worker in workers:
        assert ticks_sent(worker) >= SECONDS, worker.output()[-2000:]
        log = worker.output()
        assert "beat: Starting..." in log and "Sending due task schedules-tick" not in log, log[-2000:]


def ticks_sent(worker: Worker) -> int:
    """How many schedules.tick this worker's beat sent, from its schedule file (celery's shelve)."""
    with shelve.open(worker.schedule, flag="r") as stored:
        return int(stored["entries"]["schedules-tick"].total_run_count)
