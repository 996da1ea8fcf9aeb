"""The engine's settings (``settings.WORKFLOWS``), typed."""

from __future__ import annotations

from typing import TypedDict, cast

from django.conf import settings


class WorkflowsSettings(TypedDict):
    MODULES: list[str]
    LEASE_SECONDS: float
    MAX_RECOVERY_ATTEMPTS: int
    ENQUEUE_GRACE_SECONDS: float
    MAX_RESULT_BYTES: int
    MAX_PAYLOAD_BYTES: int
    MAX_STEP_TIMEOUT_SECONDS: int
    STEP_TIMEOUT_GRACE_SECONDS: float
    TASK_BUDGET_SECONDS: float
    QUEUE: str
    PUBLIC_QUEUE: str
    MAX_ACTIVE_RUNS_PER_OWNER: int
    MAX_WAITING_EVENTS_PER_RUN: int
    STREAM_TTL_SECONDS: int
    STREAM_MAX_EVENTS: int
    STEP_COMMIT: str


def conf() -> WorkflowsSettings:
    """Read at call time, so tests that override settings.WORKFLOWS see their values."""
    return cast(WorkflowsSettings, settings.WORKFLOWS)
