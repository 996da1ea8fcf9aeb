"""One log line per change of a run's state, with its context in fields (``extra=``).

Every line names ``event`` (``run.started``, ``run.waiting``, ``step.completed``, ...) and, where
they apply, ``run_id``, ``attempt``, ``step`` and ``workflow``: with ``LOG_FORMAT=json`` they are
the JSON line's own keys (``ops.logformat``), with the plain format the message says the same in
words. Never a payload, a result or an error's message (they may quote what a customer sent): an
error's type at most.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from workflows.models import WorkflowRun
from workflows.outbox import on_commit

logger = logging.getLogger("workflows.runs")


def log_run(run: WorkflowRun, state: str, *, step: str = "", later: bool = False, **fields: Any) -> None:
    """Log ``run.<state>`` for ``run`` (and ``step``, ``reason``, ... where given and not empty).
    ``later``: once the current transaction commits, so a change rolled back logs nothing."""
    log_state(run.id, run.attempt, run.workflow, state, step=step, later=later, **fields)


def log_state(
    run_id: UUID, attempt: int, workflow: str, state: str, *, step: str = "", later: bool = False, **fields: Any
) -> None:
    """``log_run`` for a caller that has the run's fields, not the run."""
    extra: dict[str, Any] = {"event": f"run.{state}", "run_id": str(run_id), "attempt": attempt, "workflow": workflow}
    if step:
        extra["step"] = step
    extra.update({name: value for name, value in fields.items() if value not in ("", None)})
    where = f" at step {step!r}" if step else ""
    args = (run_id, workflow, attempt, state, where)
    if later:
        on_commit(lambda: logger.info("run %s (%s, attempt %s) %s%s", *args, extra=extra))
    else:
        logger.info("run %s (%s, attempt %s) %s%s", *args, extra=extra)
