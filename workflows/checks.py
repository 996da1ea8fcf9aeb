"""System checks for the engine's settings: a misconfiguration is an error at start-up."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, register

from workflows.conf import conf


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    errors: list[Error] = []
    if conf()["STEP_COMMIT"] not in ("sync", "async"):
        errors.append(
            Error(f"WORKFLOWS_STEP_COMMIT is {conf()['STEP_COMMIT']!r}; use sync or async", id="workflows.E001")
        )
    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("visibility_timeout", 3600)
    if conf()["MAX_STEP_TIMEOUT_SECONDS"] >= visibility:
        errors.append(
            Error(
                f"WORKFLOWS_MAX_STEP_TIMEOUT ({conf()['MAX_STEP_TIMEOUT_SECONDS']} s) must be below the broker's "
                f"visibility timeout ({visibility} s), or Redis hands a running task to a second worker",
                id="workflows.E002",
            )
        )
    if conf()["LEASE_SECONDS"] <= 0:
        errors.append(Error("WORKFLOWS_LEASE_SECONDS must be positive", id="workflows.E003"))
    if getattr(settings, "CELERY_TASK_ALWAYS_EAGER", False):
        errors.append(
            Error(
                "CELERY_TASK_ALWAYS_EAGER must be off: the engine sends its tasks by name (workflows.outbox), "
                "which Celery never runs eagerly, and a run advanced inside the request would hold its lease "
                "there; tests run a real worker (tests.support.Worker)",
                id="workflows.E007",
            )
        )
    errors += _check_time_limit(visibility)
    return errors


def _check_time_limit(visibility: float) -> list[Error]:
    """Celery's hard time limit sits between the longest a healthy task runs and the visibility timeout."""
    errors: list[Error] = []
    if conf()["STEP_TIMEOUT_GRACE_SECONDS"] <= 0 or conf()["TASK_BUDGET_SECONDS"] <= 0:
        errors.append(
            Error("WORKFLOWS_STEP_TIMEOUT_GRACE and WORKFLOWS_TASK_BUDGET must be positive", id="workflows.E004")
        )
    limit = getattr(settings, "CELERY_TASK_TIME_LIMIT", None)
    longest = conf()["TASK_BUDGET_SECONDS"] + conf()["MAX_STEP_TIMEOUT_SECONDS"] + conf()["STEP_TIMEOUT_GRACE_SECONDS"]
    if limit is None or limit <= longest:
        errors.append(
            Error(
                f"CELERY_TASK_TIME_LIMIT ({limit} s) must be above WORKFLOWS_TASK_BUDGET + WORKFLOWS_MAX_STEP_TIMEOUT "
                f"+ WORKFLOWS_STEP_TIMEOUT_GRACE ({longest:g} s): without it a step stuck in C code holds its worker "
                f"process for ever; below it Celery kills healthy runs",
                id="workflows.E005",
            )
        )
    elif limit >= visibility:
        errors.append(
            Error(
                f"CELERY_TASK_TIME_LIMIT ({limit} s) must be below the broker's visibility timeout ({visibility} s), "
                f"or Redis hands a running task to a second worker",
                id="workflows.E006",
            )
        )
    return errors
