"""The crash tests that matter most, on RabbitMQ: Celery's workers and this test process send to
quorum queues with publisher confirms (``CELERY_BROKER_URL=amqp://...``, config/broker.py).

The rest of the suite runs on Redis; running all of it twice would not fit CI's time. These are
the promises that depend on the broker: a message held by a killed worker comes back, a lost one
is sent again by the sweeper, and a short countdown (a sleep, a retry backoff) is delivered when
due without a sweep."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures import NoEnqueue
from tests.support import Worker, use_broker, wait_for, wait_for_terminal
from tests.workflows_fixtures import lines
from workflows import public as wf
from workflows.models import RunStatus, StepResult, WorkflowRun
from workflows.sweeper import sweep

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

RABBITMQ_URL = os.environ.get("RABBITMQ_TEST_URL", "amqp://guest:guest@127.0.0.1:5672//")


@pytest.fixture
def rabbitmq(queue: str) -> Iterator[str]:
    """This test process sends to RabbitMQ (its Worker gets ``CELERY_BROKER_URL=rabbitmq``); the
    test's queues are deleted from RabbitMQ by the last worker to stop (``Worker.stop``)."""
    from kombu.connection import Connection

    try:
        with Connection(RABBITMQ_URL, connect_timeout=5) as conn:  # type: ignore[no-untyped-call]  # kombu
            conn.ensure_connection(max_retries=1)
    except Exception as exc:  # noqa: BLE001 - any failure to reach it says the same
        pytest.fail(f"RabbitMQ is not reachable at {RABBITMQ_URL} ({exc}); scripts/test.sh starts it")
    with use_broker(RABBITMQ_URL):
        yield RABBITMQ_URL


def list_queues(*columns: str, check: bool = True) -> dict[str, list[str]]:
    """Each queue as RabbitMQ lists it (rabbitmqctl, on this machine's broker): name -> ``columns``."""
    rabbitmqctl = shutil.which("rabbitmqctl")
    assert rabbitmqctl, "rabbitmqctl is not installed"
    out = subprocess.run(
        [rabbitmqctl, "-q", "list_queues", "name", *columns],
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    ).stdout
    rows = (line.split() for line in out.splitlines())
    return {row[0]: row[1:] for row in rows if len(row) == 1 + len(columns)}


def queue_types(*names: str) -> dict[str, str]:
    """The type of each of ``names``, and whether it is durable."""
    queues = list_queues("type", "durable")
    return {name: f"{kind} durable={durable}" for name, (kind, durable) in queues.items() if name in names}


def queue_counts(name: str) -> str:
    """What RabbitMQ holds of queue ``name``: messages ready, unacknowledged, and its consumers (for a
    failure's message: a listing that fails says so rather than hide the failure it explains)."""
    row = list_queues("messages_ready", "messages_unacknowledged", "consumers", check=False).get(name)
    return f"ready {row[0]}, unacked {row[1]}, consumers {row[2]}" if row else "not listed"


def test_on_rabbitmq_a_killed_worker_mid_step_loses_nothing_and_repeats_nothing(
    queue: str, rabbitmq: str, workers: list[Worker], tmp_path: Path
) -> None:
    # given a run of 5 steps whose step 2 is slow, on a worker (with beat) on RabbitMQ
    path = str(tmp_path / "lines")
    workers.append(Worker(queue=queue, beat=True, CELERY_BROKER_URL=rabbitmq))
    run = wf.start("test.lines", {"path": path, "steps": 5, "slow_step": 2, "slow_seconds": 3})
    wait_for(lambda: "2" in lines(path), what="step 2 to start")
    # (its queues are quorum queues, durable: RabbitMQ keeps the unacknowledged message)
    assert queue_types(queue, f"{queue}-io") == {queue: "quorum durable=true", f"{queue}-io": "quorum durable=true"}

    # when the worker's whole process group is SIGKILLed while step 2 runs, and a new one starts
    workers[0].kill()
    workers.append(Worker(queue=queue, beat=True, CELERY_BROKER_URL=rabbitmq))

    # then the run completes; steps before 2 ran once, step 2 at most twice, the rest once
    run = wait_for_terminal(run.id, timeout=60)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.result == [0, 1, 2, 3, 4]
    counts = Counter(lines(path))
    assert [counts[str(i)] for i in (0, 1, 3, 4)] == [1, 1, 1, 1]
    assert 1 <= counts["2"] <= 2
    assert run.recovery_count == 1
    assert StepResult.objects.filter(run=run).count() == 5


def test_on_rabbitmq_a_lost_enqueue_is_recovered_by_the_sweeper(
    queue: str, rabbitmq: str, workers: list[Worker], tmp_path: Path, no_enqueue: NoEnqueue
) -> None:
    # given a run committed without its Celery message (a crash between commit and send)
    path = str(tmp_path / "lines")
    run = wf.start("test.lines", {"path": path, "steps": 2})
    no_enqueue.stop()
    assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.QUEUED
    workers.append(Worker(queue=queue, beat=False, CELERY_BROKER_URL=rabbitmq))

    # when the sweeper (here, in this process: it sends to RabbitMQ) runs after the grace period
    requeued: list[float] = []

    def swept() -> bool:
        requeued.append(sweep().requeued)
        return bool(WorkflowRun.objects.get(pk=run.pk).status != RunStatus.QUEUED)

    try:
        wait_for(swept, timeout=30, interval=0.2, what="the sweeper to requeue the run")
    except AssertionError as exc:  # (once, in a loaded CI run: say where the messages went)
        counts = queue_counts(queue)
        raise AssertionError(f"{exc}: sent {sum(requeued)} time(s); {queue}: {counts}") from None

    # then the run is enqueued again, on RabbitMQ, and completes
    run = wait_for_terminal(run.id)
    assert run.status == RunStatus.COMPLETED
    assert lines(path) == ["0", "1"]


def test_on_rabbitmq_a_short_sleep_wakes_by_its_countdown_without_a_sweep(
    queue: str, rabbitmq: str, workers: list[Worker]
) -> None:
    # given a worker without beat: no sweeper fires timers, only the engine's countdown message can
    # wake a sleeping run (it waits in RabbitMQ's delayed-delivery queues, not in a worker)
    workers.append(Worker(queue=queue, beat=False, CELERY_BROKER_URL=rabbitmq))

    # when a run sleeps half a second between two steps (less than the whole second RabbitMQ's
    # delayed delivery counts in: the outbox rounds it up)
    started = time.monotonic()
    run = wf.start("test.sleep", {"seconds": 0.5})

    # then it wakes and completes, not before its timer was due
    run = wait_for_terminal(run.id, timeout=30)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.result is not None and run.result["slept"] >= 0.5
    assert time.monotonic() - started < 20
    # and the worker saw its quorum queues (per-consumer QoS) and bound them for delayed delivery
    output = workers[0].output()
    assert "Global QoS is disabled" in output
    assert "direct exchange" not in output
