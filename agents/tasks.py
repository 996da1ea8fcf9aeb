"""Celery tasks: queue the turns of the submissions accepted into an agent's inbox, and the sweep
of inboxes whose task was lost (beat).

Nothing in ``agents`` imports this module: the services send these tasks by their names.
"""

from __future__ import annotations

from celery import shared_task

from agents import submissions


@shared_task(name=submissions.QUEUE_TASK)  # type: ignore[untyped-decorator]  # celery has no types
def queue_submissions(agent_id: int) -> int:
    return submissions.submissions_queue(agent_id)


@shared_task(name=submissions.SWEEP_TASK)  # type: ignore[untyped-decorator]  # celery has no types
def sweep_submissions() -> int:
    return submissions.submissions_sweep()
