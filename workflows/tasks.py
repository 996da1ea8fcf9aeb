"""Celery tasks: take ids, call the engine. Retries live in the engine, not here.

Nothing in ``workflows`` imports this module: the outbox sends these tasks by their names.
"""

from __future__ import annotations

from celery import shared_task

from workflows import dispatch, engine, sweeper
from workflows.outbox import ADVANCE_TASK, RUN_STEP_TASK, SWEEP_TASK


@shared_task(name=ADVANCE_TASK)  # type: ignore[untyped-decorator]  # celery has no types
def advance_run(run_id: str) -> str:
    return engine.advance(run_id)


@shared_task(name=RUN_STEP_TASK)  # type: ignore[untyped-decorator]  # celery has no types
def run_step(run_id: str, attempt: int, position: int, tries: int | None = None) -> str:
    # tries is absent from messages queued before it was added: they run the step's current try.
    return dispatch.run_dispatched_step(run_id=run_id, attempt=attempt, position=position, tries=tries)


@shared_task(name=SWEEP_TASK)  # type: ignore[untyped-decorator]  # celery has no types
def sweep() -> dict[str, float]:
    report = sweeper.sweep()
    return {"timers_fired": report.timers_fired, "requeued": report.requeued, "seconds": report.seconds}
