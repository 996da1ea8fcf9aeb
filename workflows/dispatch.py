"""Steps sent to another queue (``step.do(..., queue="name")``): the task that runs one try.

The try's outcome is written to the step row and wakes the run, which replays and moves on (or
decides the retry backoff, since only the workflow code knows its Retries).

A message may come late (a try the run already gave up on and sent again) or twice (a broker
redelivery): it names its try, and the task first claims that try with a conditional UPDATE, so
a body runs at most once per try and a stale message runs nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, cast
from uuid import UUID

from django.db import transaction
from django.utils import timezone

from workflows import step_store
from workflows.context import in_step
from workflows.metrics import step_observed
from workflows.models import RunStatus, StepResult, StepStatus, WorkflowRun
from workflows.services import wake_locked_run

CLAIMED = "claimed_at"  # the key of StepResult.call that marks the try as taken by a task


def resolve(reference: str) -> Callable[..., Any]:
    module_name, _, qualname = reference.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    return cast("Callable[..., Any]", target)  # the engine made the reference from a callable


def run_dispatched_step(*, run_id: UUID | str, attempt: int, position: int, tries: int | None = None) -> str:
    """Run try ``tries`` of the step, unless it is not the step's current try or was claimed already.

    ``tries`` is None for a message sent before messages named their try: it takes the current one.
    """
    row = StepResult.objects.filter(
        run_id=UUID(str(run_id)), attempt=attempt, position=position, status=StepStatus.RUNNING
    ).first()
    if row is None or not row.call:
        return "gone"
    if tries is not None and row.tries != tries:
        return "stale"
    if not _claim(row):
        return "duplicate"
    fields: dict[str, Any] = {"finished_at": timezone.now(), "wake_at": None}
    try:
        fn = resolve(row.call["fn"])
        message = f"step {row.name!r} try {row.tries} ran past its timeout of {row.call['timeout']:g}s"
        with step_store.time_limit(float(row.call["timeout"]), message), in_step(row.run_id, attempt, row.name):
            value = fn(*row.call["args"])
        fields["result"], _ = step_store.encode(value, what=f"the result of step {row.name!r}")
        fields["status"] = StepStatus.COMPLETED
    except Exception as exc:
        fields["status"] = StepStatus.RETRYING  # wake_at None: the run decides the backoff
        fields["error"] = step_store.error_record(exc)
    fields["finished_at"] = timezone.now()
    with transaction.atomic():
        run = WorkflowRun.objects.select_for_update().get(pk=run_id)
        # The run decides whether a failed try is retried or the step's end (its Retries): "retried".
        outcome = "completed" if fields["status"] == StepStatus.COMPLETED else "retried"
        seconds = (fields["finished_at"] - row.started_at).total_seconds() if row.started_at else 0.0
        step_observed(run.workflow, outcome, seconds, row.tries)
        written = StepResult.objects.filter(pk=row.pk, status=StepStatus.RUNNING, tries=row.tries).update(**fields)
        if written and run.attempt == attempt and run.status == RunStatus.WAITING and run.wait_step == row.name:
            wake_locked_run(run, reason="step_reported")
    return str(fields["status"]) if written else "superseded"


def _claim(row: StepResult) -> bool:
    """Take the try for this task: one conditional UPDATE, so of two deliveries one runs the body."""
    assert row.call is not None
    call = {**row.call, CLAIMED: timezone.now().isoformat()}
    return bool(
        StepResult.objects.filter(pk=row.pk, status=StepStatus.RUNNING, tries=row.tries)
        .exclude(call__has_key=CLAIMED)
        .update(call=call)
    )
