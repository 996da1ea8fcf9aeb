"""Schedules the tests fire: written straight to the table, due when the test says."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from schedules.models import Action, Schedule


def workflow_schedule(name: str = "echo", *, due: datetime | None, every: int | None = 60, **fields: Any) -> Schedule:
    """Starts test.echo (a public workflow of tests/workflows_fixtures.py) every ``every`` seconds."""
    values: dict[str, Any] = {
        "interval_seconds": every,
        "action": Action.WORKFLOW,
        "workflow": "test.echo",
        "payload": {"from": name},
        "next_due_at": due,
        **fields,
    }
    return Schedule.objects.create(name=name, **values)


def submission_schedule(name: str = "remind", *, due: datetime | None, account: str = "acme") -> Schedule:
    """Submits a message to the test.chat agent ``reminders`` of ``account`` every hour."""
    return Schedule.objects.create(
        name=name,
        cron="0 * * * *",
        action=Action.SUBMISSION,
        account=account,
        agent_kind="test.chat",
        agent_name="reminders",
        message="Time to re-assess the suppliers.",
        next_due_at=due,
    )
