"""What bench/engine.py runs in the worker processes (loaded through WORKFLOWS_MODULES=bench.workflows).

- ``bench.noop``: ``payload["steps"]`` durable no-op steps, the throughput and overhead shape.
- ``bench.wait``: waits for a ``bench.go`` event, then one step whose result is ``time.time()`` at the
  moment its body starts: the resume half of the event-to-resume latency.
- ``bench.outcome`` (bench/inbound.py): waits for the ledger operation ``payload["key"]`` to be settled
  by someone else (``ledger.wait_for_outcome``), then one step whose result is ``time.time()`` as its
  body starts: the resume half of the webhook-to-resume latency.
- ``bench.approval`` (bench/approvals.py): raises an approval request for the ``bench-approvers`` group
  (``wait_for_approval``), then one step whose result is ``time.time()`` as its body starts: the resume
  half of the decision-to-resume latency.
- ``bench.noop`` the Celery task: the plain-chain baseline, the same shape without the engine. The last
  task of a chain names a Redis list and appends the time it ran to it.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from celery import shared_task
from django.conf import settings

from workflows import Workflow, workflow
from workflows.registry import Event

WAIT_EVENT = "bench.go"


def noop() -> None:
    return None


@workflow("bench.noop")
class NoopSteps(Workflow):
    def run(self, event: Event, step: Any) -> int:
        steps = int(event.payload["steps"])
        for i in range(steps):
            step.do(f"noop {i}", noop)
        return steps


@workflow("bench.wait")
class WaitThenStep(Workflow):
    def run(self, event: Event, step: Any) -> float:
        step.wait_for_event("wait", type=WAIT_EVENT)
        resumed: float = step.do("resumed", time.time)
        return resumed


@workflow("bench.outcome")
class OutcomeThenStep(Workflow):
    def run(self, event: Event, step: Any) -> float:
        from ledger import wait_for_outcome

        if not wait_for_outcome(step, "wait for the outcome", key=str(event.payload["key"]), timeout=3600):
            raise RuntimeError("the outcome did not come within the hour")
        resumed: float = step.do("resumed", time.time)
        return resumed


APPROVERS = "bench-approvers"


@workflow("bench.approval")
class ApprovalThenStep(Workflow):
    def run(self, event: Event, step: Any) -> float:
        from approvals.waits import wait_for_approval  # the approvals app is loaded by then

        wait_for_approval(
            step,
            name="bench",
            subject=("bench.item", str(event.payload["n"])),
            version="1",
            summary="bench approval",
            approvers=APPROVERS,
            timeout=3600,
        )
        resumed: float = step.do("resumed", time.time)
        return resumed


_redis: redis.Redis | None = None


@shared_task(name="bench.noop_task")  # type: ignore[untyped-decorator]  # celery has no types
def noop_task(done_key: str | None = None) -> None:
    """A plain Celery no-op; the last of a chain records when it ran."""
    global _redis
    if done_key:
        if _redis is None:
            _redis = redis.Redis.from_url(settings.REDIS_URL)
        _redis.rpush(done_key, repr(time.time()))
