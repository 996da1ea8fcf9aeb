"""The outbox: the one way anything leaves the database, deferred to commit.

A Celery enqueue or a stream push sent from inside an open transaction could announce a row that
is then rolled back, or arrive before the row is visible. Everything goes through ``on_commit``;
a crash between commit and send is repaired by the sweeper (lost enqueue) or is harmless
(progress is best effort).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from uuid import UUID

from django.db import transaction

if TYPE_CHECKING:
    from workflows.models import WorkflowRun

logger = logging.getLogger(__name__)


def on_commit(fn: Callable[[], Any]) -> None:
    """Run ``fn`` after the current transaction commits (at once in autocommit); log, never raise."""
    transaction.on_commit(fn, robust=True)


def enqueue_run(run_id: UUID, *, queue: str, countdown: float | None = None) -> None:
    """Ask a worker on ``queue`` (the run's) to advance the run once the current transaction commits."""

    def send() -> None:
        from workflows.tasks import advance_run

        options: dict[str, Any] = {"queue": queue}
        if countdown:
            options["countdown"] = countdown
        advance_run.apply_async((str(run_id),), **options)

    on_commit(send)


def emit_status(run: WorkflowRun) -> None:
    """Push the run's status, as it is in memory now, to its stream once the transaction commits."""
    from workflows.selectors import status_summary
    from workflows.streams import publish_later

    run_id, summary = run.id, status_summary(run)
    on_commit(lambda: publish_later(run_id, "status", summary))
