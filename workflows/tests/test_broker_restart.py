"""A worker outlives its broker: Redis restarts, without persistence, under a running worker.

The broker is a redis-server of the test's own (``RedisServer``): restarting the machine's shared
Redis would disturb every other test process using it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.utils import timezone

from tests.support import RedisServer, Worker, use_broker, wait_for, wait_for_terminal
from tests.workflows_fixtures import lines
from workflows import public as wf
from workflows.models import RunStatus, WorkflowRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.stop()


def test_a_worker_outlives_a_redis_restart_and_no_run_is_lost(
    queue: str, private_redis: RedisServer, workers: list[Worker], tmp_path: Path
) -> None:
    broker = private_redis.url
    with use_broker(broker):
        # given one worker process (with beat: the sweeper) on a Redis broker of the test's own,
        # busy with a run's slow step, and a second run whose message waits in Redis behind it
        workers.append(Worker(queue=queue, beat=True, concurrency=1, CELERY_BROKER_URL=broker))
        busy_path, waiting_path = str(tmp_path / "busy"), str(tmp_path / "waiting")
        busy = wf.start("test.lines", {"path": busy_path, "steps": 3, "slow_step": 1, "slow_seconds": 3})
        wait_for(lambda: "1" in lines(busy_path), what="the busy run's slow step to start")
        waiting = wf.start("test.lines", {"path": waiting_path, "steps": 2})
        client = redis.Redis.from_url(broker)
        wait_for(lambda: client.llen(queue) > 0, timeout=10, what="the waiting run's message to be queued")

        # when Redis shuts down without saving and starts again: every message it held is gone
        private_redis.restart()
        restarted = timezone.now()
        assert client.dbsize() == 0

        # then the worker is still alive, reconnects, and advances a run started after the restart
        after_path = str(tmp_path / "after")
        after = wf.start("test.lines", {"path": after_path, "steps": 2})
        assert wait_for_terminal(after.id, timeout=45).status == RunStatus.COMPLETED
        assert workers[0].alive(), workers[0].output()
        assert "Connection to broker lost" in workers[0].output()

        # and the run whose message was lost with Redis completes: the sweeper enqueued it again
        # (from PostgreSQL, after WORKFLOWS_ENQUEUE_GRACE_SECONDS)
        run = wait_for_terminal(waiting.id, timeout=45)
        assert run.status == RunStatus.COMPLETED, run.error
        assert run.enqueued_at is not None and run.enqueued_at > restarted
        assert lines(waiting_path) == ["0", "1"]

        # and so does the run that was mid-step: no committed step ran again
        run = wait_for_terminal(busy.id, timeout=45)
        assert run.status == RunStatus.COMPLETED, run.error
        assert run.result == [0, 1, 2]
        counts = Counter(lines(busy_path))
        assert (counts["0"], counts["2"]) == (1, 1)
        assert 1 <= counts["1"] <= 2
        assert workers[0].alive()
        assert WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count() == 3
