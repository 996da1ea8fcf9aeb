"""Celery tasks: take ids, call the engine. Retries live in the engine, not here."""

from __future__ import annotations

from celery import shared_task

from workflows import dispatch, engine, sweeper


@shared_task(name="workflows.advance")  # type: ignore[untyped-decorator]  # celery has no types
def advance_run(run_id: str) -> str:
    return engine.advance(run_id)


@shared_task(name="workflows.run_step")  # type: ignore[untyped-decorator]  # celery has no types
def run_step(run_id: str, attempt: int, position: int, tries: int | None = None) -> str:
    # tries is absent from messages queued before it was added: they run the step's current try.
    return dispatch.run_dispatched_step(run_id=run_id, attempt=attempt, position=position, tries=tries)


@shared_task(name="workflows.sweep")  # type: ignore[untyped-decorator]  # celery has no types
def sweep() -> dict[str, float]:
    report = sweeper.sweep()
    return {"timers_fired": report.timers_fired, "requeued": report.requeued, "seconds": report.seconds}
