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
    # Redis's visibility timeout, or the consumer_timeout RabbitMQ is said to have (config/broker.py).
    visibility = settings.BROKER_ACK_TIMEOUT
    if conf()["MAX_STEP_TIMEOUT_SECONDS"] >= visibility:
        errors.append(
            Error(
                f"WORKFLOWS_MAX_STEP_TIMEOUT ({conf()['MAX_STEP_TIMEOUT_SECONDS']} s) must be below the broker's "
                f"{_ack_timeout_name()} ({visibility:g} s), {_ack_timeout_cost()}",
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
                f"CELERY_TASK_TIME_LIMIT ({limit} s) must be below the broker's {_ack_timeout_name()} "
                f"({visibility:g} s), {_ack_timeout_cost()}",
                id="workflows.E006",
            )
        )
    return errors


def _ack_timeout_name() -> str:
    return "consumer timeout (RABBITMQ_CONSUMER_TIMEOUT)" if settings.BROKER.amqp else "visibility timeout"


def _ack_timeout_cost() -> str:
    if settings.BROKER.amqp:
        return (
            "or RabbitMQ closes the worker's channel under a running task and requeues its message "
            "(raise consumer_timeout in rabbitmq.conf and RABBITMQ_CONSUMER_TIMEOUT, or lower the limits)"
        )
    return "or Redis hands a running task to a second worker"
